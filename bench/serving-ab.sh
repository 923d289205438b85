#!/usr/bin/env bash
# Two builds of the serving engine in ONE call on one GPU machine, alternated (A B A B) at one load:
# a change that should not move serving (issue 47's model seam) shown within noise, with the
# tokens of both builds compared request by request. Each build is a gzipped serve_bench
# (`scripts/build-gpu serving`, copied aside before and after the change) in target-gpu/carry-seam/.
# From the device tool:
#   run(command="A=serve-bench-<old>.gz B=serve-bench-<new>.gz bench/serving-ab.sh",
#       carry=["target-gpu/carry-seam"], timeout_s=600)
# SHAPE=8B STREAMS=64 PROMPT=512 GEN=256 ROUNDS=2 by default; one JSON line per run goes to
# $OUT/serving-ab.jsonl (append it to bench/results/serving.jsonl), the comparison is printed.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${A:?A=<old serve-bench .gz in target-gpu/carry-seam>}" "${B:?B=<new serve-bench .gz>}"
SHAPE=${SHAPE:-8B} STREAMS=${STREAMS:-64} PROMPT=${PROMPT:-512} GEN=${GEN:-256} ROUNDS=${ROUNDS:-2}
LOGS=${OUT:-bench/results}
mkdir -p "$LOGS"
WORK=$(mktemp -d /tmp/mx-serving-ab.XXXX)
for who in A B; do
  gunzip -c "target-gpu/carry-seam/${!who}" >"$WORK/$who" && chmod +x "$WORK/$who"
done
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
{ date -u; echo "$GPU, driver $DRIVER; A=$A B=$B"; } | tee "$LOGS/serving-ab.log"
for round in $(seq "$ROUNDS"); do
  for who in A B; do
    "$WORK/$who" device=cuda shape="$SHAPE" streams="$STREAMS" prompt="$PROMPT" gen="$GEN" \
      arrivals=all_at_once adapters=0 budget_s=120 out="$WORK/$who.$round.jsonl" 2>>"$LOGS/serving-ab.log" >/dev/null
  done
done
python3 - "$WORK" "$LOGS/serving-ab.jsonl" "$GPU" "$DRIVER" "$A" "$B" "$ROUNDS" "$STREAMS" <<'PY'
import datetime, json, os, statistics, sys
work, out_p, gpu, driver, a, b, rounds, streams = sys.argv[1:9]
metric = f"streams_{streams}_all_at_once_output_tok_s"
date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
runs = {"A": [], "B": []}
with open(out_p, "a") as f:
    for who, build in (("A", a), ("B", b)):
        for r in range(1, int(rounds) + 1):
            p = os.path.join(work, f"{who}.{r}.jsonl")
            rows = {x["metric"]: x for x in map(json.loads, open(p))} if os.path.exists(p) else {}
            row = rows.get(metric, {})
            runs[who].append(row)
            f.write(json.dumps({"date": date, "gpu": gpu, "driver": driver, "build": build, "round": r,
                                "metric": metric, "ours": row.get("ours"),
                                "batch1_decode_tok_s": rows.get("batch1_decode_tok_s", {}).get("ours")}) + "\n")
tok = {w: [x.get("ours") for x in rs if x.get("ours")] for w, rs in runs.items()}
for w, build in (("A", a), ("B", b)):
    print(f"{w} {build}: {metric} {tok[w]}")
if tok["A"] and tok["B"]:
    ma, mb = statistics.mean(tok["A"]), statistics.mean(tok["B"])
    spread = max(max(v) - min(v) for v in tok.values()) / ma
    print(f"B / A = {mb / ma:.4f} (run-to-run spread within a build: {spread:.2%})")
digests = [x.get("token_digests") for rs in runs.values() for x in rs]
print("tokens identical across builds and rounds:", all(d == digests[0] for d in digests) and digests[0] is not None)
PY
rm -rf "$WORK"
