#!/usr/bin/env bash
# The online benchmark on a GPU in one call: `vllm bench serve` (examples/bench/serve.py)
# against examples/server over libvllm.so, on random Llama-3.1-8B weights.
#
#   bash examples/bench/serve_gpu.sh [NUM_PROMPTS] [MAX_CONCURRENCY]
#   (env: MODEL=a config.json directory, INPUT_LEN=1024, OUTPUT_LEN=128, DTYPE=bfloat16,
#    VOCAB=32000: prompt ids are drawn below it, SERVER_FLAGS: more server flags, e.g.
#    --no-multiprocessing; the engine core runs in its own process by default on CUDA)
#
# Builds build/libvllm.so for this machine's Python (capi/build.py; needs cffi), starts the
# server with vLLM's --load-format dummy --skip-tokenizer-init (token-id prompts), waits
# for /health, runs random 1024-in / 128-out prompts with --ignore-eos at an infinite
# request rate, prints vLLM's result block and writes JSON and the server log under
# ${OUT:-/tmp}. Exits non-zero if the server does not come up.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
prompts=${1:-200}
concurrency=${2:-64}
port=8123
model=${MODEL:-examples/bench/models/llama-3.1-8b}
python3 capi/build.py > "$out/serve-build.log" 2>&1 || { tail -20 "$out/serve-build.log"; exit 1; }
python3 examples/server/server.py "$model" --load-format dummy \
    --skip-tokenizer-init --dtype "${DTYPE:-bfloat16}" --max-model-len 2048 --max-num-seqs 256 \
    --max-num-queued-reqs 4096 --port "$port" --lib build/libvllm.so \
    --uvicorn-log-level warning ${SERVER_FLAGS:-} > "$out/serve-server.log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
started=$(date +%s)
until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health')" \
        2>/dev/null; do
    if ! kill -0 $server 2>/dev/null || [ $(( $(date +%s) - started )) -gt 240 ]; then
        tail -30 "$out/serve-server.log"; exit 1
    fi
    sleep 1
done
echo "server healthy after $(( $(date +%s) - started )) s"
python3 -m examples.bench serve --port "$port" --dataset-name random \
    --input-len "${INPUT_LEN:-1024}" --output-len "${OUTPUT_LEN:-128}" \
    --num-prompts "$prompts" --max-concurrency "$concurrency" \
    --ignore-eos --temperature 1.0 --vocab-size "${VOCAB:-32000}" --output-json "$out/serve.json"
