/*
 * examples/c/batched.c - 8 concurrent requests with different sampling params on one
 * engine, driven by its background loop, with events pushed to a callback; one request
 * is aborted from its own callback after 4 tokens.
 *
 *   cc -std=c11 -Iinclude examples/c/batched.c -Lbuild -lvllm -Wl,-rpath,$PWD/build \
 *      -pthread -o batched
 *   ./batched MODEL.gguf "The capital of France is"
 *
 * Prints, per request in order: "[id] params -> finish=REASON tokens=N" and its text.
 */

#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "vllm.h"

#define N_REQUESTS 8
#define CANCELLED 5 /* the request cancelled after 4 tokens */

typedef struct {
    char id[16];
    char params[96];
    char text[4096];
    int tokens;
    int32_t finish_reason;
} request_state;

static vllm_engine *engine;
static request_state requests[N_REQUESTS];
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t all_done = PTHREAD_COND_INITIALIZER;
static int n_finished;

/* Runs on the engine's loop thread; the event is valid during the call only. */
static void on_event(const vllm_event *event, void *user_data) {
    request_state *r = user_data;
    pthread_mutex_lock(&mutex);
    strncat(r->text, event->text, sizeof r->text - strlen(r->text) - 1);
    r->tokens = event->num_output_tokens;
    if (event->finished) {
        r->finish_reason = event->finish_reason;
        if (event->status != VLLM_OK) fprintf(stderr, "[%s] error: %s\n", r->id, event->error);
        n_finished++;
        pthread_cond_signal(&all_done);
    }
    pthread_mutex_unlock(&mutex);
    /* Callbacks may call the library: cancel one request mid-stream (by id, once). */
    if (r == &requests[CANCELLED] && !event->finished && event->num_output_tokens >= 4 &&
        event->num_output_tokens - (int32_t)event->n_token_ids < 4)
        vllm_request_abort(engine, r->id);
}

static const char *reason_name(int32_t reason) {
    static const char *const names[] = {"none", "stop", "length", "abort", "error",
                                        "repetition"};
    return reason >= 0 && reason <= VLLM_FINISH_REPETITION ? names[reason] : "?";
}

/* Request i's sampling params: greedy, then a spread of temperature/top-p/top-k/min-p. */
static vllm_sampling_params params_for(int i, char *describe, size_t size) {
    vllm_sampling_params sp;
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.max_tokens = 32;
    sp.seed = 1000 + i;
    sp.has_seed = 1;
    switch (i) {
    case 0: sp.temperature = 0.0f; break;
    case 1: sp.temperature = 0.7f; break;
    case 2: sp.temperature = 1.0f; sp.top_p = 0.9f; break;
    case 3: sp.temperature = 0.8f; sp.top_k = 40; break;
    case 4: sp.temperature = 1.2f; sp.min_p = 0.05f; break;
    case 5: sp.temperature = 0.0f; sp.max_tokens = 200; sp.ignore_eos = 1; break;
    case 6: sp.temperature = 0.5f; sp.max_tokens = 8; break;
    default: sp.temperature = 1.0f; sp.top_k = 5; sp.top_p = 0.5f; break;
    }
    snprintf(describe, size, "temperature=%.2f top_p=%.2f top_k=%d min_p=%.2f max_tokens=%d",
             sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.max_tokens);
    return sp;
}

int main(int argc, char **argv) {
    vllm_engine_params params;
    int i;
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT\n", argv[0]);
        return 2;
    }
    vllm_engine_params_init(&params, sizeof params);
    params.max_model_len = 1024;
    if (vllm_engine_create(argv[1], &params, &engine) != VLLM_OK ||
        vllm_engine_start_loop(engine) != VLLM_OK) {
        fprintf(stderr, "engine: %s\n", vllm_last_error());
        vllm_shutdown();
        return 1;
    }
    for (i = 0; i < N_REQUESTS; i++) {
        request_state *r = &requests[i];
        vllm_sampling_params sp = params_for(i, r->params, sizeof r->params);
        snprintf(r->id, sizeof r->id, "req-%d", i);
        /* push mode without a handle: the callback gets every event, the last one once */
        if (vllm_request_submit(engine, r->id, argv[2], NULL, 0, &sp, on_event, r, NULL) !=
            VLLM_OK) {
            fprintf(stderr, "submit %s: %s\n", r->id, vllm_last_error());
            return 1;
        }
    }
    pthread_mutex_lock(&mutex);
    while (n_finished < N_REQUESTS) pthread_cond_wait(&all_done, &mutex);
    pthread_mutex_unlock(&mutex);

    for (i = 0; i < N_REQUESTS; i++) {
        request_state *r = &requests[i];
        printf("[%s] %s -> finish=%s tokens=%d\n%s\n", r->id, r->params,
               reason_name(r->finish_reason), r->tokens, r->text);
    }
    vllm_engine_free(engine);
    vllm_shutdown();
    return 0;
}
