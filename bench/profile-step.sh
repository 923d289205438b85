#!/usr/bin/env bash
# Where one replayed decode step's time goes, kernel by kernel: Nsight Compute (`ncu`, clocks left
# alone) times every kernel of ONE graph replay of `serve_bench probe` and counts its DRAM bytes,
# then the table sums them per kernel name (time, bytes, achieved TB/s, launches). Carry the
# serving build (`scripts/build-gpu serving`):
#   run(command="ROWS=64 bench/profile-step.sh", carry=["target-gpu/carry-serving"], kind="nvidia-h200")
# ROWS (the decode batch, default 64; the probe's context is 640 tokens a row) and SHAPE (default 8B).
# PREFILL=NxLEN (e.g. 16x512) profiles a prefill step of N prompts of LEN tokens instead (the
# probe's third step with tensor-core attention; the table keeps the last step's kernels).
# ncu serialises kernels, so the sum is each kernel's own time without overlap; compare it with
# the probe's graph-replay step time, which this script also prints (run without the profiler).
# DETAIL=REGEX (e.g. paged_attn_tc) adds ncu's full sections (speed of light, memory workload,
# warp stall reasons, occupancy) for the first two kernels whose name matches, in
# profile-step-detail.txt: why a kernel sits where it does, not only how long it takes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-64} SHAPE=${SHAPE:-8B}
LOGS=${OUT:-bench/results}
mkdir -p "$LOGS"
WORK=$(mktemp -d /tmp/mx-profile.XXXX)
trap 'rm -rf "$WORK"' EXIT
gunzip -c target-gpu/carry-serving/serve-bench.gz >"$WORK/serve-bench" && chmod +x "$WORK/serve-bench"
if [[ -n ${PREFILL:-} ]]; then
  PROBE=(device=cuda shape="$SHAPE" probe=0 probe_prefill="$PREFILL" probe_variants=tensor_core_attention)
else
  PROBE=(device=cuda shape="$SHAPE" probe="$ROWS" probe_variants=cuda_graph)
fi
"$WORK/serve-bench" "${PROBE[@]}" | tee "$LOGS/profile-step-probe.jsonl"
ncu --clock-control none --graph-profiling node --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  "$WORK/serve-bench" "${PROBE[@]}" probe_steps=1 >"$WORK/ncu.csv" 2>"$WORK/ncu.err" || {
  tail -20 "$WORK/ncu.err"; exit 1; }
python3 bench/profile_table.py "$WORK/ncu.csv" | tee "$LOGS/profile-step.txt"
if [[ -n ${DETAIL:-} ]]; then
  ncu --clock-control none --graph-profiling node --kernel-name "regex:$DETAIL" --launch-count 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    "$WORK/serve-bench" "${PROBE[@]}" probe_steps=1 >"$LOGS/profile-step-detail.txt" 2>"$WORK/ncu-detail.err" || {
    tail -20 "$WORK/ncu-detail.err"; exit 1; }
  grep -E "stalled|DRAM Throughput|Memory Throughput|L2 Hit|L1/TEX Hit|Stall|Warp Cycles|Achieved Occupancy|Registers|Shared Memory Config|Eligible|Issued Warp|Duration|Mem Busy|Max Bandwidth" "$LOGS/profile-step-detail.txt" | head -120
fi
