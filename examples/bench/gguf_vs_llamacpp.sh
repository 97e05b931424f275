#!/usr/bin/env bash
# GGUF side by side with llama.cpp on the GPU machine: the same random-weight GGUF files
# through llama-bench and through our `latency` benchmark.
#
#   .lc/: a llama.cpp source tree and its llama-bench build script, prepared outside the
#         repository (never committed); .whl/: a cp312 wheel of gguf for the GPU machine
#   device call, carry [".lc", ".whl"]:  bash examples/bench/gguf_vs_llamacpp.sh [KIND ...]
#
# KIND: q4_k_m and/or q8_0 (Llama-3.1-8B shapes; default both), qwen35moe-q4_k_m or
# qwen35moe-q8_0 (Qwen3.5-35B-A3B, llama.cpp's qwen35moe). For each: (1)
# examples/bench/random_gguf_quant.py writes the file (kept in $GGUF_DIR across calls of
# one warm machine), (2) llama-bench -p 512 -n 128
# -ngl 99 -fa 1 -r 3 (.lc/llamacpp-bench.sh builds it once per machine, ~260 s), (3) ours:
# batch-1 decode (latency, input 32, output 128: decode tok/s excluding the first step) and
# a 512-token prefill (latency, input 512, output 1: 512 / latency, llama-bench's pp512
# counterpart), then a table of both with ours / llama.cpp. Results also stay in
# $GGUF_DIR/results so a later call can resume: STEPS (default "gen lc ours") picks the
# steps, e.g. STEPS=lc in one call and STEPS="ours" in the next (10-minute calls).
# Env: OUT (default /tmp), GGUF_DIR (/tmp/gguf-bench), ITERS (5), WARMUP (3), OUR_FLAGS
# (more engine flags), SMALL=1 (the generator's tiny 8-layer model: a quick CPU smoke with
# STEPS="gen ours"; llama-bench needs the GPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
dir=${GGUF_DIR:-/tmp/gguf-bench}
res=$dir/results${SMALL:+-small}
steps=" ${STEPS:-gen lc ours} "
mkdir -p "$out" "$res"
kinds=("$@"); [ ${#kinds[@]} -gt 0 ] || kinds=(q4_k_m q8_0)
gen=examples/bench/random_gguf_quant.py
if ! python3 -c "import gguf" 2>/dev/null && compgen -G ".whl/gguf-*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/gguf-*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
ours() {  # ours NAME FILE INPUT_LEN OUTPUT_LEN
    python3 -m examples.bench latency --model "$2" --skip-tokenizer-init --batch-size 1 \
        --input-len "$3" --output-len "$4" --num-iters-warmup "${WARMUP:-3}" \
        --num-iters "${ITERS:-5}" --output-json "$res/$1.json" ${OUR_FLAGS:-} \
        > "$res/$1.log" 2>&1 || { tail -30 "$res/$1.log"; return 1; }
    grep -E "Avg latency|decode throughput" "$res/$1.log" || true
}
for kind in "${kinds[@]}"; do
    arch=llama quant=$kind name=llama-3.1-8b-$kind
    [[ $kind == qwen35moe-* ]] && arch=qwen35moe quant=${kind#qwen35moe-} \
        name=qwen3.5-35b-a3b-$quant
    f=$dir/$name${SMALL:+-small}.gguf
    if [[ $steps == *" gen "* && ! -f $f ]]; then
        echo "== writing $f"
        python3 "$gen" "$f.tmp" "$quant" --arch "$arch" ${SMALL:+--small} && mv "$f.tmp" "$f"
    fi
    if [[ $steps == *" lc "* ]]; then
        echo "== llama-bench $kind"
        bash .lc/llamacpp-bench.sh "$f" -p 512 -n 128 -ngl 99 -fa 1 -r 3 | tee "$res/lc-$kind.md"
    fi
    if [[ $steps == *" ours "* ]]; then
        echo "== ours $kind: batch-1 decode (input 32, output 128)"
        ours "decode-$kind" "$f" 32 128
        echo "== ours $kind: 512-token prefill (input 512, output 1)"
        ours "prefill-$kind" "$f" 512 1
    fi
done
cp -r "$res" "$out/" 2>/dev/null || true
python3 - "$res" "${kinds[@]}" <<'PY'
import json, re, sys
from pathlib import Path

res, kinds = Path(sys.argv[1]), sys.argv[2:]


def lc(kind: str, test: str) -> float | None:
    """llama-bench's t/s of test (pp512 / tg128) from its markdown table."""
    p = res / f"lc-{kind}.md"
    if not p.exists():
        return None
    for line in p.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 2 and cells[-2] == test:
            return float(re.match(r"[\d.]+", cells[-1]).group())
    return None


def ours(name: str, key: str) -> float | None:
    p = res / f"{name}.json"
    if not p.exists():
        return None
    r = json.loads(p.read_text())
    return r.get("decode_tokens_per_second") if key == "decode" else 512 / r["avg_latency"]


print(f"\n{'file':<18}{'metric':<26}{'ours tok/s':>12}{'llama.cpp':>12}{'ratio':>8}")
for kind in kinds:
    for label, mine, theirs in (
            ("batch-1 decode (tg128)", ours(f"decode-{kind}", "decode"), lc(kind, "tg128")),
            ("512-token prefill (pp512)", ours(f"prefill-{kind}", "prefill"),
             lc(kind, "pp512"))):
        ratio = f"{mine / theirs:.2f}x" if mine and theirs else "-"
        fmt = lambda v: f"{v:12.1f}" if v else f"{'-':>12}"  # noqa: E731
        print(f"{kind:<18}{label:<26}{fmt(mine)}{fmt(theirs)}{ratio:>8}")
PY
