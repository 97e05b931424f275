#!/usr/bin/env bash
# The serve-vs-offline pair in one device call: `serve` at max concurrency 64 against the
# offline engine at --max-num-seqs 64 on the same random 300 x (1024 in, 128 out) prompts,
# and `serve` at concurrency 1 (its median TPOT). Prints both and the ratio.
#
#   OUT=/tmp/r bash examples/bench/serve_vs_offline.sh
#   (env: MODEL, DTYPE, INPUT_LEN, OUTPUT_LEN as serve_gpu.sh reads them, for both sides;
#    PROMPTS=300; ONE_PROMPTS=30; WARMUP_PROMPTS=64)
#
# serve_gpu.sh builds libvllm.so and runs examples/server with --load-format dummy; the
# offline figure is `python -m examples.bench throughput` with the same weights and flags.
# A short offline run comes first (WARMUP_PROMPTS=64, 0 for none): it fills Triton's on-disk
# kernel cache with the kernels the first traffic compiles, so neither measured side pays
# the JIT (on a fresh machine the side run first lost 4-8% to it).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
model=${MODEL:-examples/bench/models/llama-3.1-8b}
prompts=${PROMPTS:-300}
mkdir -p "$out/serve64" "$out/serve1"
offline() {  # $1 prompts, $2 json
    python3 -m examples.bench throughput --model "$model" --load-format dummy \
        --skip-tokenizer-init --dtype "${DTYPE:-bfloat16}" --max-model-len 2048 \
        --dataset-name random --input-len "${INPUT_LEN:-1024}" \
        --output-len "${OUTPUT_LEN:-128}" --num-prompts "$1" --max-num-seqs 64 \
        --output-json "$2"
}
if [ "${WARMUP_PROMPTS:-64}" -gt 0 ]; then
    offline "${WARMUP_PROMPTS:-64}" "$out/warmup.json" > "$out/warmup.txt" 2>&1 \
        || { tail -30 "$out/warmup.txt"; exit 1; }
fi
MODEL=$model OUT=$out/serve64 bash examples/bench/serve_gpu.sh "$prompts" 64 \
    > "$out/serve64.txt" 2>&1 || { tail -30 "$out/serve64.txt"; exit 1; }
offline "$prompts" "$out/offline64.json" > "$out/offline64.txt" 2>&1 \
    || { tail -30 "$out/offline64.txt"; exit 1; }
MODEL=$model OUT=$out/serve1 bash examples/bench/serve_gpu.sh "${ONE_PROMPTS:-30}" 1 \
    > "$out/serve1.txt" 2>&1 || { tail -30 "$out/serve1.txt"; exit 1; }
python3 - "$out" <<'PY'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
serve64 = json.loads((out / "serve64" / "serve.json").read_text())
offline = json.loads((out / "offline64.json").read_text())
serve1 = json.loads((out / "serve1" / "serve.json").read_text())
ratio = serve64["request_throughput"] / offline["requests_per_second"]
print(f"serve, 64 streams: {serve64['request_throughput']:.2f} req/s; offline, 64 sequences: "
      f"{offline['requests_per_second']:.2f} req/s; ratio {ratio:.3f} (target >= 0.95)")
print(f"serve, one stream: median TPOT {serve1['median_tpot_ms']:.2f} ms, P99 "
      f"{serve1['p99_tpot_ms']:.2f} ms (target <= 4.18)")
PY
