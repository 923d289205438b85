#!/usr/bin/env bash
# Our trainer against the PEFT peer, in ONE call on one GPU machine: for each Qwen3 shape, a LoRA
# step of ours (trainer example gpu_step, carried in target-gpu/carry/gpu-step.gz by
# scripts/build-gpu) and of HF transformers + PEFT (bench/peft_peer.py, the machine's python3),
# then tok/s, peak memory and the ratio per shape. From the device tool:
#   run(command="bench/run.sh", carry=["target-gpu/carry"])
# SHAPES="0.6B:8:2048 1.7B:4:2048 8B:2:2048" by default; OURS_STEPS / PEER_WARMUP / PEER_STEPS.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${OUT:-target-gpu/out}
mkdir -p "$LOGS"
BIN=$(mktemp -d)
gunzip -c target-gpu/carry/gpu-step.gz >"$BIN/gpu-step" && chmod +x "$BIN/gpu-step"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } | tee "$LOGS/bench.log"
for s in ${SHAPES:-0.6B:8:2048 1.7B:4:2048 8B:2:2048}; do
  IFS=: read -r shape b t <<<"$s"
  "$BIN/gpu-step" "$shape" "$b" "$t" "${OURS_STEPS:-5}" 2>>"$LOGS/bench.log" | tee -a "$LOGS/results.jsonl" \
    || echo "{\"who\":\"ours\",\"shape\":\"$shape\",\"error\":\"failed (see bench.log)\"}" | tee -a "$LOGS/results.jsonl"
  PYTHONUNBUFFERED=1 python3 bench/peft_peer.py "$shape" "$b" "$t" "${PEER_WARMUP:-3}" "${PEER_STEPS:-5}" 2>>"$LOGS/bench.log" \
    | tee -a "$LOGS/results.jsonl" \
    || echo "{\"who\":\"peft\",\"shape\":\"$shape\",\"error\":\"failed (see bench.log)\"}" | tee -a "$LOGS/results.jsonl"
done
python3 - "$LOGS/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault(r["shape"], {})[r["who"]] = r
# MFU: our model-FLOP count per step (the same work for both sides) over each side's step time,
# against the bf16 GEMM ceiling our binary measured in this run. Memory: the driver's
# memory.used after each step, both sides.
print(f"{'shape':<6} {'ours tok/s':>11} {'peft tok/s':>11} {'ratio':>6} {'ours MFU':>9} {'peft MFU':>9} {'ours GiB':>9} {'peft GiB':>9}")
for shape, d in by.items():
    o, p = d.get("ours", {}), d.get("peft", {})
    ratio = o["tok_per_s"] / p["tok_per_s"] if "tok_per_s" in o and "tok_per_s" in p else float("nan")
    mfu = lambda r: f"{o['step_flops'] / r['s_per_step'] / o['gemm_flops_per_s']:.1%}" if "step_flops" in o and "s_per_step" in r else "n/a"
    print(f"{shape:<6} {o.get('tok_per_s', 'n/a'):>11} {p.get('tok_per_s', 'n/a'):>11} {ratio:>6.2f} {mfu(o):>9} {mfu(p):>9} {o.get('peak_gib', 'n/a'):>9} {p.get('peak_gib', 'n/a'):>9}")
PY
