/*
 * tests/c/engine_cycles.c - COUNT cycles of vllm_engine_create, one greedy request
 * (caller-driven steps), vllm_engine_free; prints the resident set size (VmRSS of
 * /proc/self/status, kB) after each free: "cycle N rss KB". tests/test_runtime_memory.py.
 *
 *   engine_cycles MODEL.gguf COUNT
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vllm.h"

static long rss_kb(void) {
    char line[256];
    long kb = -1;
    FILE *status = fopen("/proc/self/status", "r");
    if (status == NULL) return -1;
    while (fgets(line, sizeof line, status) != NULL)
        if (strncmp(line, "VmRSS:", 6) == 0) kb = strtol(line + 6, NULL, 10);
    fclose(status);
    return kb;
}

static int fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, vllm_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) return fprintf(stderr, "usage: %s MODEL.gguf COUNT\n", argv[0]), 2;
    int count = atoi(argv[2]);
    for (int cycle = 1; cycle <= count; cycle++) {
        vllm_engine *engine = NULL;
        vllm_sampling_params sp;
        const vllm_request_output *out;
        size_t n, left = 1;
        if (vllm_engine_create(argv[1], NULL, &engine) != VLLM_OK) return fail("create");
        vllm_sampling_params_init(&sp, sizeof sp);
        sp.temperature = 0.0f;
        sp.max_tokens = 16;
        if (vllm_request_add(engine, "r", "The capital of France is", NULL, 0, &sp) != VLLM_OK)
            return fail("add");
        while (left > 0) {
            if (vllm_engine_step(engine, &out, &n) != VLLM_OK) return fail("step");
            if (vllm_engine_num_unfinished(engine, &left) != VLLM_OK) return fail("unfinished");
        }
        vllm_engine_free(engine);
        printf("cycle %d rss %ld\n", cycle, rss_kb());
        fflush(stdout);
    }
    vllm_shutdown();
    return 0;
}
