/*
 * tests/c/unfinished_push_test.c - vllm_engine_num_unfinished counts a push request
 * until its last callback has returned (include/vllm.h, vllm_engine_num_unfinished).
 *
 * ROUNDS rounds on one looping engine: submit PER_ROUND push requests whose callback
 * sleeps on the last event before it records that it returned; the main thread polls
 * vllm_engine_num_unfinished until it reads 0, then checks that every last callback has
 * returned. Prints "PASS", or "FAIL round R: ..." and exits 1.
 *   ./unfinished_push_test MODEL.gguf
 */

#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "vllm.h"

#define ROUNDS 10
#define PER_ROUND 3

static atomic_int returned; /* last callbacks that have returned */

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void on_event(const vllm_event *event, void *user_data) {
    (void)user_data;
    if (!event->finished) return;
    sleep_ms(30); /* a host that takes a while with the last output */
    atomic_fetch_add(&returned, 1);
}

int main(int argc, char **argv) {
    vllm_engine_params params;
    vllm_sampling_params sp;
    vllm_engine *engine;
    int round, i, failed = 0;
    if (argc != 2) return 2;
    vllm_engine_params_init(&params, sizeof params);
    params.max_model_len = 512;
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.temperature = 0.0f;
    sp.max_tokens = 4;
    if (vllm_engine_create(argv[1], &params, &engine) != VLLM_OK ||
        vllm_engine_start_loop(engine) != VLLM_OK) {
        printf("FAIL engine: %s\n", vllm_last_error());
        return 1;
    }
    for (round = 0; round < ROUNDS && !failed; round++) {
        size_t n = 1;
        atomic_store(&returned, 0);
        for (i = 0; i < PER_ROUND; i++) {
            char id[32];
            snprintf(id, sizeof id, "r%d-%d", round, i);
            if (vllm_request_submit(engine, id, "Hello", NULL, 0, &sp, on_event, NULL, NULL) !=
                VLLM_OK) {
                printf("FAIL submit: %s\n", vllm_last_error());
                return 1;
            }
        }
        while (n > 0) {
            if (vllm_engine_num_unfinished(engine, &n) != VLLM_OK) {
                printf("FAIL num_unfinished: %s\n", vllm_last_error());
                return 1;
            }
            if (n > 0) sleep_ms(1);
        }
        if (atomic_load(&returned) != PER_ROUND) {
            printf("FAIL round %d: num_unfinished read 0 with %d of %d last callbacks "
                   "returned\n", round, atomic_load(&returned), PER_ROUND);
            failed = 1;
        }
    }
    vllm_engine_free(engine);
    vllm_shutdown();
    if (!failed) printf("PASS\n");
    return failed;
}
