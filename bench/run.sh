#!/usr/bin/env bash
# Our trainer against its peers, in ONE call on one GPU machine. Per Qwen3 shape, each in its own
# process, one after another on the same GPU:
#   ours    trainer example gpu_step (scripts/build-gpu train: target-gpu/carry-train/gpu-step.gz;
#           target-gpu/carry/gpu-step.gz from `scripts/build-gpu tests` also serves)
#   peft    HF transformers + PEFT, SDPA (bench/hf_peer.py, the machine's python3)
#   liger   the same + Liger kernels 0.8.5 (RoPE, RMSNorm, SwiGLU, fused linear cross-entropy), from
#           the wheel in .whl/ (pure Python + Triton; the machine has torch and triton)
#   unsloth not measured: it does not install offline within a call's 64 MiB (see UNSLOTH below)
# Each side times two batches: `uniform` (one document of SEQ tokens per row) and `packed` (documents
# of mixed lengths packed into each row, attention kept inside each document: our segment masks,
# HF's packed position ids), both the median of the timed steps after warm-up, with peak memory.
# One JSON line per metric (date, gpu, driver, commit, metric, ours, peer, peer_value, ratio) goes
# to $OUT/$JSONL.jsonl (JSONL=train by default; the device call's output: append it to
# bench/results/$JSONL.jsonl) or, run by hand, to bench/results/$JSONL.jsonl; the ratio table is
# printed at the end. From the device tool:
#   run(command="COMMIT=<hash> bench/run.sh", carry=["target-gpu/carry-train", ".whl"], timeout_s=600)
# The Qwen3-30B-A3B MoE shape (issue 21; ~61 GB of bf16 weights: an H200, so needs_h200) is its own call, its lines
# in moe.jsonl: SHAPES="30B-A3B:2:2048" JSONL=moe bench/run.sh
# Instella-3B (bench/instella_shapes.py) is bench/instella.sh, which calls this script; the Qwen3.6
# hybrids (bench/qwen3_6_shapes.py) bench/hybrid.sh.
# Settings (environment): SHAPES="0.6B:8:2048 1.7B:4:2048 8B:2:2048", PEERS="ours peft liger unsloth",
# STEPS=5 (timed steps per batch kind; ours warms up 2, the peers PEER_WARMUP=3), PACKED=1,
# BUDGET_S=480 (the whole bench; a process gets what is left, at most RUN_S=170, and a process that
# cannot start is reported as skipped), DOC_MIN=32 (shortest packed document; lengths log-uniform
# from it to SEQ), PACK_SEED=0.
set -uo pipefail
cd "$(dirname "$0")/.."
SHAPES=${SHAPES:-0.6B:8:2048 1.7B:4:2048 8B:2:2048} PEERS=${PEERS:-ours peft liger unsloth}
STEPS=${STEPS:-5} PEER_WARMUP=${PEER_WARMUP:-3} PACKED=${PACKED:-1} BUDGET_S=${BUDGET_S:-480} RUN_S=${RUN_S:-170}
LOGS=${OUT:-bench/results}
mkdir -p "$LOGS"
WORK=$(mktemp -d /tmp/mx-train.XXXX)
START=$SECONDS
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
{ date -u; echo "$GPU, driver $DRIVER, commit $COMMIT"; } | tee "$LOGS/bench.log"
RESULTS=$WORK/results.jsonl
: >"$RESULTS"
UNSLOTH="unsloth 2026.10.9 needs, beyond what the GPU machine has, unsloth_zoo, trl (<= 1.15), datasets (< 5, with dill and multiprocess), torchao, cut_cross_entropy, tyro, pydantic + pydantic-core, hf_transfer, diffusers, json5, nest-asyncio, structlog and msgspec (bitsandbytes and xformers optional): its own wheel is 28.6 MB (27 MB of it a bundled web app, studio/) and the closure about 50 MB, which with our 12 MB binary passes the 64 MiB a device call carries; the machine cannot reach a registry"

fail() { # who shape reason: one error row per batch kind the process would have reported
  echo "{\"who\":\"$1\",\"shape\":\"$2\",\"kind\":\"uniform\",\"error\":\"$3\"}" | tee -a "$RESULTS"
  [[ $PACKED == 1 ]] && echo "{\"who\":\"$1\",\"shape\":\"$2\",\"kind\":\"packed\",\"error\":\"$3\"}" | tee -a "$RESULTS"
}
# Runs "$@" (one side at one shape) with what is left of the budget; its stdout rows go to RESULTS.
side() {
  local who=$1 shape=$2 left=$((BUDGET_S - (SECONDS - START)))
  shift 2
  ((left > RUN_S)) && left=$RUN_S
  if ((left < 20)); then fail "$who" "$shape" "skipped: the bench's budget (BUDGET_S=$BUDGET_S s) is spent"; return; fi
  local n0 t0=$SECONDS
  n0=$(wc -l <"$RESULTS")
  timeout "$left" "$@" 2>>"$LOGS/bench.log" | tee -a "$RESULTS"
  local rc=${PIPESTATUS[0]}
  echo "$who $shape: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOGS/bench.log"
  if (($(wc -l <"$RESULTS") == n0)); then
    fail "$who" "$shape" "exit $rc after $((SECONDS - t0)) s$( ((rc == 124)) && echo ' (timed out)'), see bench.log"
  fi
}

BIN=""
for gz in target-gpu/carry-train/gpu-step.gz target-gpu/carry/gpu-step.gz; do
  if [[ -f $gz ]]; then gunzip -c "$gz" >"$WORK/gpu-step" && chmod +x "$WORK/gpu-step" && BIN=$WORK/gpu-step; break; fi
done
# The peers' wheels carried in .whl/ (pure Python + Triton; the machine has torch and triton):
# Liger, and for the Qwen3.6 hybrids flash-linear-attention (fla-core + its einops), whose gated
# delta rule transformers picks up when it is importable. Both HF peers get them on PYTHONPATH.
SITE=""
if ls .whl/*.whl >/dev/null 2>&1 \
  && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" .whl/*.whl \
    >>"$LOGS/bench.log" 2>&1; then
  SITE=$WORK/site
else
  echo "peers: no wheel installed from .whl/ (carry .whl, see docs/benchmarks.md)" | tee -a "$LOGS/bench.log"
fi
LIGER_PATH=""
[[ -n $SITE && -d $SITE/liger_kernel ]] && LIGER_PATH=$SITE
[[ " $PEERS " == *" unsloth "* ]] && echo "unsloth: not measured: $UNSLOTH" | tee -a "$LOGS/bench.log"

for s in $SHAPES; do
  IFS=: read -r shape b t <<<"$s"
  PACKING=()
  if [[ $PACKED == 1 ]]; then
    # Documents of log-uniform lengths from DOC_MIN to SEQ, packed in order; a row's last document
    # is cut to fit. The same file for every side.
    python3 - "$b" "$t" "${DOC_MIN:-32}" "${PACK_SEED:-0}" >"$WORK/packing-$shape" <<'PY'
import math, random, sys
b, t, lo, seed = map(int, sys.argv[1:5])
rng = random.Random(f"{seed}/{b}/{t}")
for _ in range(b):
    row, left = [], t
    while left:
        n = min(left, int(math.exp(rng.uniform(math.log(lo), math.log(t)))))
        row.append(n)
        left -= n
    print(" ".join(map(str, row)))
PY
    PACKING=("$WORK/packing-$shape")
    echo "packed rows at $shape: $(wc -w <"$WORK/packing-$shape") documents in $b rows of $t" | tee -a "$LOGS/bench.log"
  fi
  for who in $PEERS; do
    case $who in
      ours)
        if [[ -n $BIN ]]; then side ours "$shape" "$BIN" "$shape" "$b" "$t" $((STEPS + 2)) "${PACKING[@]}"
        else fail ours "$shape" "no gpu-step.gz under target-gpu/carry-train or target-gpu/carry (scripts/build-gpu train)"; fi ;;
      peft)
        side peft "$shape" env PYTHONUNBUFFERED=1 PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" python3 bench/hf_peer.py peft "$shape" "$b" "$t" "$PEER_WARMUP" "$STEPS" "${PACKING[@]}" ;;
      liger)
        # On Instella shapes hf_peer.py runs without the wheel: its rows say why Liger has none.
        if [[ -n $LIGER_PATH || $shape == instella* ]]; then
          side liger "$shape" env PYTHONUNBUFFERED=1 PYTHONPATH="$LIGER_PATH${PYTHONPATH:+:$PYTHONPATH}" \
            python3 bench/hf_peer.py liger "$shape" "$b" "$t" "$PEER_WARMUP" "$STEPS" "${PACKING[@]}"
        else fail liger "$shape" "liger-kernel not installed: no .whl/liger_kernel-*.whl carried"; fi ;;
      unsloth) fail unsloth "$shape" "not measured: $UNSLOTH" >/dev/null ;;  # said once, above
      *) echo "unknown side $who (ours, peft, liger, unsloth)" | tee -a "$LOGS/bench.log" ;;
    esac
  done
done
cp "$RESULTS" "$LOGS/results.jsonl"
echo "bench: $((SECONDS - START)) s in all" | tee -a "$LOGS/bench.log"
python3 bench/train_report.py "$RESULTS" "$LOGS/${JSONL:-train}.jsonl" "$GPU" "$DRIVER" "$COMMIT"
rm -rf "$WORK"
