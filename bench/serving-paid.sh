#!/usr/bin/env bash
# The paid-load serving benchmark (issue 18) in ONE call on one GPU machine: serve-paid-bench
# (carried gzipped with anvil in target-gpu/carry-paid/ by `scripts/build-gpu paid`) serves random
# Qwen3 weights on the GPU behind the node's chat route twice, sold over x402 (in-process
# facilitator, TestUSDC on a local anvil, payment.* events in a real event log) and unpaid, and
# runs the same load on both in alternating rounds. One JSON line per metric is appended to
# $OUT/serving.jsonl (the device call's output; append it to bench/results/serving.jsonl) or, run
# by hand, to bench/results/serving.jsonl: ours = paid, peer_value = unpaid, ratio = paid/unpaid
# (the goal: output tokens/s ratio >= 0.98). From the device tool:
#   run(command="COMMIT=<hash> bench/serving-paid.sh", carry=["target-gpu/carry-paid"], timeout_s=600)
# DEVICE=cuda SHAPE=8B STREAMS=64 PROMPT=512 GEN=256 ROUNDS=4 by default; BUDGET_S=540 keeps the call
# under its 10 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda} SHAPE=${SHAPE:-8B} STREAMS=${STREAMS:-64} PROMPT=${PROMPT:-512} GEN=${GEN:-256} ROUNDS=${ROUNDS:-4}
CARRY=target-gpu/carry-paid
LOGS=${OUT:-bench/results}
mkdir -p "$LOGS"
for f in serve-paid-bench.gz anvil.gz; do
  [[ -f $CARRY/$f ]] || { echo "serving-paid: $CARRY/$f missing: run scripts/build-gpu paid first" >&2; exit 1; }
done
WORK=$(mktemp -d /tmp/mx-serving-paid.XXXX)
for f in serve-paid-bench anvil; do gunzip -c "$CARRY/$f.gz" >"$WORK/$f" && chmod +x "$WORK/$f"; done
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
{ date -u; echo "$GPU, driver $DRIVER"; } | tee "$LOGS/serving-paid.log"
MINDXTRAIN_ANVIL=$WORK/anvil timeout "${BUDGET_S:-540}" "$WORK/serve-paid-bench" --device "$DEVICE" --shape "$SHAPE" \
  --streams "$STREAMS" --prompt "$PROMPT" --gen "$GEN" --rounds "$ROUNDS" --out "$WORK/paid.jsonl" \
  2>>"$LOGS/serving-paid.log" | tee -a "$LOGS/serving-paid.log"
STATUS=${PIPESTATUS[0]}
if [[ $STATUS != 0 ]]; then
  echo "serving-paid: serve-paid-bench exited $STATUS; the end of $LOGS/serving-paid.log:" >&2
  tail -20 "$LOGS/serving-paid.log" >&2
  rm -rf "$WORK"
  exit 1
fi
cp "$WORK/paid.jsonl" "$LOGS/"
python3 - "$WORK/paid.jsonl" "$LOGS/serving.jsonl" "$GPU" "$DRIVER" "${COMMIT:-unknown}" <<'PY'
import datetime, json, sys
ours_p, out_p, gpu, driver, commit = sys.argv[1:6]
date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
lines = []
for r in map(json.loads, open(ours_p)):
    paid, unpaid = r.pop("paid", None), r.pop("unpaid", None)
    extra = {k: v for k, v in r.items() if k not in ("metric", "ratio")}
    ratio = paid / unpaid if isinstance(paid, (int, float)) and isinstance(unpaid, (int, float)) and unpaid else None
    lines.append({"date": date, "gpu": gpu, "driver": driver, "commit": commit, "metric": r["metric"], "ours": paid,
                  "peer": "same route unpaid (no x402)" if unpaid is not None else None, "peer_value": unpaid,
                  "ratio": ratio, **extra})
with open(out_p, "a") as f:
    for l in lines:
        f.write(json.dumps(l) + "\n")
print(f"{'metric':<36} {'paid':>14} {'unpaid':>14} {'ratio':>7}")
for l in lines:
    fmt = lambda v: f"{v:14.4g}" if isinstance(v, (int, float)) else f"{'-':>14}"
    ratio = f"{l['ratio']:7.4f}" if l["ratio"] else f"{'-':>7}"
    print(f"{l['metric']:<36} {fmt(l['ours'])} {fmt(l['peer_value'])} {ratio}")
PY
rm -rf "$WORK"
