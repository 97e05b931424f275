/*
 * tests/c/exit_with_loop.c - returns from main while the background loop generates,
 * without vllm_request_free, vllm_engine_free or vllm_shutdown: the process must exit
 * with status 0, never crash (capi/at_exit.py stops the loops before the exit
 * destructors run). tests/test_runtime_exit.py, tests/exit_with_loop.py.
 *
 *   exit_with_loop MODEL.gguf
 */

#include <stdio.h>

#include "vllm.h"

int main(int argc, char **argv) {
    vllm_engine *engine = NULL;
    vllm_request *request = NULL;
    vllm_sampling_params sp;
    if (argc != 2) return fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]), 2;
    if (vllm_engine_create(argv[1], NULL, &engine) != VLLM_OK ||
        vllm_engine_start_loop(engine) != VLLM_OK)
        return fprintf(stderr, "%s\n", vllm_last_error()), 1;
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.max_tokens = 4096;
    sp.ignore_eos = 1;
    if (vllm_request_submit(engine, "r", "Once upon a time", NULL, 0, &sp, NULL, NULL,
                            &request) != VLLM_OK)
        return fprintf(stderr, "%s\n", vllm_last_error()), 1;
    puts("submitted");  /* the loop is starting the request's prefill: return meanwhile */
    return 0;
}
