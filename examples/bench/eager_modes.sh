#!/usr/bin/env bash
# Eager batch-1 decode with the engine core in process and in its own process (the CUDA
# default), with the per-step probe of examples/bench/step_probe on, in one call:
#
#   bash examples/bench/eager_modes.sh [VARIANT ...]
#   VARIANT: inproc (VLLM_ENABLE_V1_MULTIPROCESSING=0) | child (the default mode) |
#            child-threads (the default mode with OMP_NUM_THREADS=$(nproc), which keeps
#            torch's intra-op threads while serving: engine/worker/torch_threads.py);
#            default: all three
#   (env: MODEL=a config.json directory, default examples/bench/models/llama-3.1-8b;
#    INPUT_LEN=1024, OUTPUT_LEN=128, ITERS=3, DTYPE=bfloat16, BENCH_FLAGS: more flags)
#
# Runs `python3 -m examples.bench latency --load-format dummy --skip-tokenizer-init
# --enforce-eager --batch-size 1` once per variant; per variant writes the latency JSON,
# the log and the probe files (step wall and CPU time of the core's stepping thread, its
# context switches a step, torch threads, affinity, threads alive) and the processes
# holding a CUDA context (nvidia-smi every 5 s) under ${OUT:-/tmp}, and prints the decode
# throughput and the probe summary. About 30 s a variant on an H200.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(inproc child child-threads)
for v in "${variants[@]}"; do
    case $v in
        inproc) env_v=(VLLM_ENABLE_V1_MULTIPROCESSING=0) ;;
        child) env_v=(VLLM_ENABLE_V1_MULTIPROCESSING=1) ;;
        child-threads) env_v=(VLLM_ENABLE_V1_MULTIPROCESSING=1 OMP_NUM_THREADS=$(nproc)) ;;
        *) echo "unknown variant $v" >&2; exit 2 ;;
    esac
    rm -f "$out/eager-$v".*.json
    # which processes hold a CUDA context (the front end should not, in the child mode)
    ( while sleep 5; do nvidia-smi --query-compute-apps=pid,process_name,used_memory \
          --format=csv,noheader 2>/dev/null; done ) > "$out/eager-$v-gpu-procs.txt" &
    sampler=$!
    env "${env_v[@]}" PYTHONPATH="$PWD/examples/bench/step_probe:$PWD${PYTHONPATH:+:$PYTHONPATH}" \
        LIBVLLM_STEP_PROBE="$out/eager-$v" \
        python3 -m examples.bench latency --model "${MODEL:-examples/bench/models/llama-3.1-8b}" \
        --load-format dummy --skip-tokenizer-init --dtype "${DTYPE:-bfloat16}" \
        --max-model-len 2048 --batch-size 1 --input-len "${INPUT_LEN:-1024}" \
        --output-len "${OUTPUT_LEN:-128}" --num-iters-warmup 1 --num-iters "${ITERS:-3}" \
        --enforce-eager --output-json "$out/eager-$v-latency.json" ${BENCH_FLAGS:-} \
        > "$out/eager-$v.log" 2>&1 || { kill $sampler; tail -20 "$out/eager-$v.log"; exit 1; }
    kill $sampler 2>/dev/null || true
    echo "== $v: $(grep -h 'decode throughput' "$out/eager-$v.log")"
    probes=("$out/eager-$v".*.json)
    [ -e "${probes[0]}" ] && python3 examples/bench/step_probe/summary.py "${probes[@]}"
    echo "processes on the GPU: $(sort -u "$out/eager-$v-gpu-procs.txt" | tr '\n' ';')"
done
