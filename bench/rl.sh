#!/usr/bin/env bash
# GRPO's step benchmark on one GPU machine: our GRPO step (trainer example rl_bench, carried
# gzipped in target-gpu/carry-rl/ by `scripts/build-gpu rl`) at the 8B shape, LoRA r16, 8 prompts
# x 8 generations, 256 new tokens, seq <= 2048, then one JSON line per metric appended to
# $OUT/rl.jsonl (the device call's output; append it to bench/results/rl.jsonl). From the device tool:
#   run(command="COMMIT=<hash> bench/rl.sh", carry=["target-gpu/carry-rl"], timeout_s=600, kind="nvidia-h200")
# The peer (TRL's GRPOTrainer with the same settings) is not part of this script yet: its lines
# carry `peer: null` until a peer run fills `peer_value` (docs/benchmarks.md says what remains).
set -uo pipefail
cd "$(dirname "$0")/.."
SHAPE=${SHAPE:-8B} STEPS=${STEPS:-4} PROMPTS=${PROMPTS:-8} GENERATIONS=${GENERATIONS:-8} NEW=${NEW:-256} SEQ=${SEQ:-2048} R=${R:-16}
LOGS=${OUT:-bench/results}
mkdir -p "$LOGS"
WORK=$(mktemp -d /tmp/mx-rl.XXXX)
gunzip -c target-gpu/carry-rl/rl-bench.gz >"$WORK/rl-bench" && chmod +x "$WORK/rl-bench"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
{ date -u; echo "$GPU, driver $DRIVER"; } | tee "$LOGS/rl.log"
"$WORK/rl-bench" device=cuda shape="$SHAPE" steps="$STEPS" prompts="$PROMPTS" generations="$GENERATIONS" \
  new_tokens="$NEW" seq_len="$SEQ" r="$R" out="$WORK/ours.jsonl" 2>>"$LOGS/rl.log" | tee -a "$LOGS/rl.log"
python3 - "$WORK/ours.jsonl" "$LOGS/rl.jsonl" "$GPU" "$DRIVER" "${COMMIT:-unknown}" <<'PY'
import datetime, json, os, sys
ours_p, out_p, gpu, driver, commit = sys.argv[1:6]
date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
rows = [json.loads(l) for l in open(ours_p)] if os.path.exists(ours_p) else []
with open(out_p, "a") as out:
    for r in rows:
        out.write(json.dumps({"date": date, "gpu": gpu, "driver": driver, "commit": commit, "metric": r["metric"],
                              "ours": r["ours"], "peer": None, "peer_value": None, "ratio": None,
                              "settings": r.get("settings")}) + "\n")
print(f"{len(rows)} lines appended to {out_p}")
PY
