/*
 * examples/c/simple.c - the smallest complete libvllm program: load a GGUF model,
 * generate a completion for a prompt and stream it to stdout.
 *
 *   cc -std=c11 -Iinclude examples/c/simple.c -Lbuild -lvllm -Wl,-rpath,$PWD/build -o simple
 *   ./simple MODEL.gguf "The capital of France is"
 */

#include <stdio.h>

#include "vllm.h"

static int fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, vllm_last_error());
    vllm_shutdown();
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT\n", argv[0]);
        return 2;
    }
    vllm_engine_params params;
    vllm_engine_params_init(&params, sizeof params);
    params.max_model_len = 1024;

    vllm_engine *engine = NULL;
    if (vllm_engine_create(argv[1], &params, &engine) != VLLM_OK) return fail("create");

    vllm_sampling_params sp;
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.temperature = 0.0f; /* greedy */
    sp.max_tokens = 32;
    if (vllm_request_add(engine, "req-0", argv[2], NULL, 0, &sp) != VLLM_OK) return fail("add");

    size_t unfinished = 1;
    while (unfinished > 0) {
        const vllm_request_output *outs = NULL;
        size_t n = 0;
        if (vllm_engine_step(engine, &outs, &n) != VLLM_OK) return fail("step");
        for (size_t i = 0; i < n; i++) fputs(outs[i].text, stdout);
        fflush(stdout);
        if (vllm_engine_num_unfinished(engine, &unfinished) != VLLM_OK) return fail("count");
    }
    putchar('\n');
    vllm_engine_free(engine);
    vllm_shutdown();
    return 0;
}
