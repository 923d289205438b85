#!/usr/bin/env bash
# A recipe through the node on one GPU machine, end to end: `mindxtrain bench` (the AOT probe)
# writes the plan, `mindxtrain train` runs it, then `mindxtrain serve` loads the trained adapter on
# the GPU and answers one OpenAI chat completion on loopback. Run ON the GPU machine from the node
# that `scripts/build-gpu node` left in target-gpu/carry-node/:
#   run(command="bench/node-gpu.sh bench/recipes/qwen3_6_35b_a3b_h200.yaml", carry=["target-gpu/carry-node"])
# Everything the node printed (plan, train and serve JSON, the answer) lands in $OUT (or
# target-gpu/out/); the script fails if any step fails or the answer is not a chat completion.
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=${1:?usage: bench/node-gpu.sh RECIPE}
LOGS=${OUT:-target-gpu/out}
mkdir -p "$LOGS"
WORK=$(mktemp -d /tmp/mx-node.XXXX)
gunzip -c target-gpu/carry-node/mindxtrain.gz >"$WORK/mindxtrain" && chmod +x "$WORK/mindxtrain"
MX=("$WORK/mindxtrain" --node-dir "$WORK/node")
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"
"${MX[@]}" init >/dev/null
step() {  # name, args...: times one node command, its JSON to $LOGS/name.json
  local name=$1 t0=$SECONDS
  shift
  "${MX[@]}" --json "$@" >"$LOGS/$name.json" 2>"$LOGS/$name.log" || { tail -30 "$LOGS/$name.log" >&2; exit 1; }
  echo "$name: $((SECONDS - t0)) s"
}
step plan bench "$RECIPE" --out "$WORK/plan.json"
step train train "$RECIPE" --plan "$WORK/plan.json" --out "$WORK/run"
# Serve the run's adapter on DEVICE (default cuda:0) on a free loopback port, free of charge, and
# ask it one question; the server is ended by its PID.
"${MX[@]}" serve "$RECIPE" --checkpoint "$WORK/run/final" --device "${DEVICE:-cuda:0}" --free --listen 127.0.0.1:0 \
  >"$LOGS/serve.log" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true' EXIT
t0=$SECONDS
python3 - "$LOGS/serve.log" "$LOGS/chat.json" "$SERVER" <<'PY'
import json, os, re, sys, time, urllib.request
log, out, server = sys.argv[1], sys.argv[2], int(sys.argv[3])
deadline = time.time() + 300
url = None
while time.time() < deadline and url is None:
    m = re.search(r"http://127\.0\.0\.1:(\d+)", open(log).read())
    url = m and f"http://127.0.0.1:{m.group(1)}"
    try:
        os.kill(server, 0)
    except ProcessLookupError:
        sys.exit(f"the server exited before listening:\n{open(log).read()[-2000:]}")
    time.sleep(1)
if url is None:
    sys.exit(f"the server printed no address in 300 s:\n{open(log).read()[-2000:]}")
body = {"model": None, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}
for _ in range(240):
    try:
        models = json.load(urllib.request.urlopen(f"{url}/v1/models", timeout=10))
        body["model"] = models["data"][0]["id"]
        break
    except Exception:
        time.sleep(1)
req = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
t = time.time()
answer = json.load(urllib.request.urlopen(req, timeout=300))
answer["client_seconds"] = time.time() - t
json.dump(answer, open(out, "w"), indent=1)
assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] > 0, answer
print(f"served {body['model']}: {answer['usage']['completion_tokens']} tokens in {answer['client_seconds']:.2f} s")
PY
echo "serve: $((SECONDS - t0)) s"
# The GPU memory the server holds while it serves: the model is on the device.
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tee "$LOGS/serve-gpu.txt"
