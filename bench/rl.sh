#!/usr/bin/env bash
# GRPO's step benchmark in ONE call on one GPU machine (issue 22): first the peer, TRL's
# GRPOTrainer with our settings (bench/rl_peer.py, the machine's python3, trl 1.16 and its missing
# deps installed from the wheels in .whl/ into a temporary --target for that process only), then
# ours (trainer example rl_bench, carried gzipped in target-gpu/carry-rl/ by `scripts/build-gpu rl`):
# the 8B shape, LoRA r16, 8 prompts x 8 generations, 256 new tokens, seq <= 2048. One JSON line per
# metric (date, gpu, driver, commit, metric, ours, peer, peer_value, ratio, settings, peer_settings,
# peer_median) is appended to $OUT/rl.jsonl (the device call's output; append it to
# bench/results/rl.jsonl) or, run by hand, to bench/results/rl.jsonl; a table is printed at the end.
# From the device tool:
#   run(command="COMMIT=<hash> bench/rl.sh", carry=["target-gpu/carry-rl", ".whl"], timeout_s=600, kind="nvidia-h200")
# `ratio` is how many times better ours is: peer/ours for seconds and bytes (`*_s`, `*_bytes`: lower
# is better), ours/peer for rates (`*_per_s`: higher is better); none where a side is missing, and
# none for grpo_completion_tokens_mean (a workload figure, not a score).
# Settings (environment): SHAPE=8B STEPS=4 (ours, the first one warm-up) PROMPTS=8 GENERATIONS=8
# NEW=256 SEQ=2048 R=16; PEER=1 (0 skips the peer), PEER_STEPS=4 (incl. its warm-up step),
# PEER_S=330 (the peer's time limit: ours takes ~90 s at 8B, so the call stays under its 600 s),
# PEER_MICRO=8 (TRL's per_device_train_batch_size; gradient accumulation makes up the 64
# completions), PEER_SAMPLE_VOCAB=byte (sample among the byte tokenizer's 266 ids, as our engine
# does; `full`: all 151,936 rows, every completion then runs to NEW tokens), PEER_ARGS (more
# bench/rl_peer.py flags, e.g. --no-gradient-checkpointing).
set -uo pipefail
cd "$(dirname "$0")/.."
SHAPE=${SHAPE:-8B} STEPS=${STEPS:-4} PROMPTS=${PROMPTS:-8} GENERATIONS=${GENERATIONS:-8} NEW=${NEW:-256} SEQ=${SEQ:-2048} R=${R:-16}
PEER=${PEER:-1} PEER_STEPS=${PEER_STEPS:-4} PEER_S=${PEER_S:-330} PEER_MICRO=${PEER_MICRO:-8}
PEER_SAMPLE_VOCAB=${PEER_SAMPLE_VOCAB:-byte}
LOGS=${OUT:-bench/results}
mkdir -p "$LOGS"
WORK=$(mktemp -d /tmp/mx-rl.XXXX)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
{ date -u; echo "$GPU, driver $DRIVER"; } | tee "$LOGS/rl.log"

# The peer, in its own process before ours (the GPU to itself; its memory is freed when it exits).
PEER_ERROR=""
if [[ $PEER != 1 ]]; then
  PEER_ERROR="not run (PEER=$PEER)"
elif ! ls .whl/trl-*.whl .whl/datasets-*.whl .whl/dill-*.whl .whl/multiprocess-*.whl >/dev/null 2>&1; then
  PEER_ERROR="no trl/datasets/dill/multiprocess wheels in .whl/ (carry .whl, see docs/benchmarks.md)"
elif ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
  .whl/trl-*.whl .whl/datasets-*.whl .whl/dill-*.whl .whl/multiprocess-*.whl >>"$LOGS/rl.log" 2>&1; then
  PEER_ERROR="pip could not install the wheels of .whl/, see rl.log"
else
  T0=$SECONDS
  # shellcheck disable=SC2086  # PEER_ARGS: more flags, split on purpose
  PYTHONUNBUFFERED=1 PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}" timeout "$PEER_S" \
    python3 bench/rl_peer.py --out "$WORK/peer.jsonl" --device cuda --shape "$SHAPE" --steps "$PEER_STEPS" \
    --prompts "$PROMPTS" --generations "$GENERATIONS" --new-tokens "$NEW" --seq-len "$SEQ" --r "$R" \
    --micro "$PEER_MICRO" --sample-vocab "$PEER_SAMPLE_VOCAB" ${PEER_ARGS:-} 2>>"$LOGS/rl.log" | tee -a "$LOGS/rl.log"
  RC=${PIPESTATUS[0]}
  echo "peer: exit $RC after $((SECONDS - T0)) s" | tee -a "$LOGS/rl.log"
  [[ -s $WORK/peer.jsonl ]] || PEER_ERROR="exit $RC after $((SECONDS - T0)) s$( ((RC == 124)) && echo " (timed out at PEER_S=$PEER_S)"), see rl.log"
fi
[[ -n $PEER_ERROR && -z ${RC:-} ]] && echo "peer: $PEER_ERROR" | tee -a "$LOGS/rl.log"

if [[ -f target-gpu/carry-rl/rl-bench.gz ]]; then
  gunzip -c target-gpu/carry-rl/rl-bench.gz >"$WORK/rl-bench" && chmod +x "$WORK/rl-bench"
  "$WORK/rl-bench" device=cuda shape="$SHAPE" steps="$STEPS" prompts="$PROMPTS" generations="$GENERATIONS" \
    new_tokens="$NEW" seq_len="$SEQ" r="$R" out="$WORK/ours.jsonl" 2>>"$LOGS/rl.log" | tee -a "$LOGS/rl.log"
else
  echo "ours: no target-gpu/carry-rl/rl-bench.gz (scripts/build-gpu rl)" | tee -a "$LOGS/rl.log"
fi

python3 - "$WORK/ours.jsonl" "$WORK/peer.jsonl" "$LOGS/rl.jsonl" "$GPU" "$DRIVER" "${COMMIT:-unknown}" "$PEER_ERROR" <<'PY'
import datetime, json, os, sys
ours_p, peer_p, out_p, gpu, driver, commit, peer_error = sys.argv[1:8]
load = lambda p: {r["metric"]: r for r in map(json.loads, open(p))} if os.path.exists(p) else {}
ours, peer = load(ours_p), load(peer_p)
date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v > 0


def ratio(metric, o, p):
    """How many times better ours is."""
    if not (num(o) and num(p)):
        return None
    if metric.endswith("_per_s"):
        return o / p
    if metric.endswith("_s") or metric.endswith("_bytes"):
        return p / o
    return None


lines = []
for metric in list(ours) + [m for m in peer if m not in ours]:
    o, p = ours.get(metric, {}), peer.get(metric, {})
    ov, pv = o.get("ours"), p.get("peer")
    ps = p.get("settings") or {}
    name = f"trl-grpotrainer-{ps.get('versions', {}).get('trl', 'unknown')}" if metric in peer else None
    line = {"date": date, "gpu": gpu, "driver": driver, "commit": commit, "metric": metric, "ours": ov,
            "peer": name, "peer_value": pv, "ratio": ratio(metric, ov, pv), "settings": o.get("settings"),
            "peer_settings": ps or None, "peer_median": p.get("peer_median")}
    if not peer and peer_error:
        line["peer_error"] = peer_error
    lines.append(line)
with open(out_p, "a") as f:
    for l in lines:
        f.write(json.dumps(l) + "\n")
fmt = lambda v: f"{v:14.4g}" if num(v) or v == 0 else f"{'-':>14}"
print(f"{'metric':<32} {'ours':>14} {'peer (TRL)':>14} {'ratio':>8}   (ratio: times better ours is)")
for l in lines:
    r = f"{l['ratio']:7.2f}x" if l["ratio"] else f"{'-':>8}"
    print(f"{l['metric']:<32} {fmt(l['ours'])} {fmt(l['peer_value'])} {r}")
if peer:
    s = next(iter(peer.values())).get("settings", {})
    print(f"peer: {lines[0]['peer'] if lines else ''}, {s.get('steps_measured')} steps measured, micro-batch "
          f"{s.get('per_device_train_batch_size')} x accumulation {s.get('gradient_accumulation_steps')}, gradient "
          f"checkpointing {s.get('gradient_checkpointing')}, sampling vocabulary {s.get('sample_vocab')}")
elif peer_error:
    print(f"peer: {peer_error}")
print(f"{len(lines)} lines appended to {out_p}")
PY
rm -rf "$WORK"
