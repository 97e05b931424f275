/*
 * tests/c/threads_test.c - 8 threads share one engine with the background loop: they
 * submit (pull and push), stream, cancel, abort by id, tokenize and read metrics at the
 * same time. tests/test_capi_threads.py builds it with -fsanitize=address.
 *
 * usage: threads_test MODEL_PATH
 * Prints "PASS" or one "FAIL thread N: why" line per failed thread; exits 1 on failure.
 *
 * Roles (thread index % 4): 0 pulls a greedy request; 1 pushes one to a callback;
 * 2 cancels a long pulled request, then pulls a greedy one; 3 has a long pushed request
 * aborted by id, exercises the tokenizer and metrics, then pulls a greedy one. Every
 * greedy request has the same prompt and 6 tokens: all texts must be equal.
 */

#define _POSIX_C_SOURCE 200809L /* pthreads, barriers */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vllm.h"

#define N_THREADS 8
#define GREEDY_TOKENS 6
#define PROMPT "The capital of France is"

typedef struct {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int events, terminals, tokens;
    int32_t finish_reason;
    char text[512];
} push_state;

typedef struct {
    int index;
    char failed[1024]; /* "" when the thread passed */
    char text[512];    /* the greedy text it streamed */
    push_state push;
} job;

static const char *model_path;
static vllm_engine *engine;
static pthread_barrier_t start;
static size_t expected_tokens; /* vllm_tokenize of PROMPT, computed before the threads */

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            int n_ = snprintf(j->failed, sizeof j->failed, "line %d: ", __LINE__); \
            snprintf(j->failed + n_, sizeof j->failed - (size_t)n_, __VA_ARGS__); \
            return;                                                             \
        }                                                                       \
    } while (0)

#define CHECK_STATUS(call, want)                                                \
    do {                                                                        \
        vllm_status got_ = (call);                                              \
        CHECK(got_ == (want), "%s: %s, want %s (%s)", #call,                    \
              vllm_status_string(got_), vllm_status_string(want), vllm_last_error()); \
    } while (0)

static vllm_sampling_params sampling(int32_t max_tokens) {
    vllm_sampling_params sp;
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.temperature = 0.0f;
    sp.max_tokens = max_tokens;
    sp.ignore_eos = 1;
    return sp;
}

static void append(char *dst, size_t size, const char *text) {
    strncat(dst, text, size - strlen(dst) - 1);
}

/* Pulls every event of request into *text; cancels once cancel_after tokens arrived
 * (0: never). Checks one terminal event and the token count. */
static void pull(job *j, vllm_request *request, int cancel_after, int32_t want_reason,
                 char *text, size_t text_size) {
    const vllm_event *event;
    int terminals = 0, tokens = 0;
    vllm_status status;
    while ((status = vllm_request_next(request, 60000, &event)) == VLLM_OK) {
        CHECK(!terminals, "an event after the last one");
        tokens += (int)event->n_token_ids;
        CHECK(event->num_output_tokens == tokens, "count %d vs %d", event->num_output_tokens,
              tokens);
        if (text != NULL) append(text, text_size, event->text);
        if (event->finished) {
            terminals++;
            CHECK(event->finish_reason == want_reason, "finish reason %d, want %d",
                  event->finish_reason, want_reason);
        }
        if (cancel_after && tokens >= cancel_after)
            CHECK_STATUS(vllm_request_cancel(request), VLLM_OK);
    }
    CHECK(status == VLLM_END_OF_STREAM, "next: %s (%s)", vllm_status_string(status),
          vllm_last_error());
    CHECK(terminals == 1, "%d last events", terminals);
}

static void pull_greedy(job *j) {
    char id[32];
    vllm_request *request = NULL;
    vllm_sampling_params sp = sampling(GREEDY_TOKENS);
    snprintf(id, sizeof id, "greedy-%d", j->index);
    CHECK_STATUS(vllm_request_submit(engine, id, PROMPT, NULL, 0, &sp, NULL, NULL, &request),
                 VLLM_OK);
    pull(j, request, 0, VLLM_FINISH_LENGTH, j->text, sizeof j->text);
    vllm_request_free(request);
}

static void on_event(const vllm_event *event, void *user_data) {
    push_state *s = user_data;
    pthread_mutex_lock(&s->mutex);
    s->events++;
    s->tokens += (int)event->n_token_ids;
    append(s->text, sizeof s->text, event->text);
    if (event->finished) {
        s->terminals++;
        s->finish_reason = event->finish_reason;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->mutex);
}

static void wait_terminal(push_state *s) {
    pthread_mutex_lock(&s->mutex);
    while (s->terminals == 0) pthread_cond_wait(&s->cond, &s->mutex);
    pthread_mutex_unlock(&s->mutex);
}

static void push_greedy(job *j) {
    vllm_sampling_params sp = sampling(GREEDY_TOKENS);
    char id[32];
    snprintf(id, sizeof id, "push-%d", j->index);
    CHECK_STATUS(vllm_request_submit(engine, id, PROMPT, NULL, 0, &sp, on_event, &j->push, NULL),
                 VLLM_OK);
    wait_terminal(&j->push);
    CHECK(j->push.finish_reason == VLLM_FINISH_LENGTH, "reason %d", j->push.finish_reason);
    CHECK(j->push.tokens == GREEDY_TOKENS, "%d tokens", j->push.tokens);
    snprintf(j->text, sizeof j->text, "%s", j->push.text);
}

static void cancel_then_greedy(job *j) {
    char id[32];
    vllm_request *request = NULL;
    vllm_sampling_params sp = sampling(200);
    snprintf(id, sizeof id, "cancel-%d", j->index);
    CHECK_STATUS(vllm_request_submit(engine, id, PROMPT, NULL, 0, &sp, NULL, NULL, &request),
                 VLLM_OK);
    pull(j, request, 2, VLLM_FINISH_ABORT, NULL, 0);
    vllm_request_free(request);
    if (j->failed[0] == '\0') pull_greedy(j);
}

static void tokenizer_and_metrics(job *j) {
    int32_t tokens[64];
    size_t n = 0, n_bytes = 0;
    char text[256];
    vllm_metrics metrics;
    int round;
    for (round = 0; round < 20; round++) {
        CHECK_STATUS(vllm_tokenize(engine, PROMPT, strlen(PROMPT), 1, 1, NULL, 0, &n), VLLM_ERR_BUFFER_TOO_SMALL);
        CHECK(n == expected_tokens, "%zu tokens, want %zu", n, expected_tokens);
        CHECK_STATUS(vllm_tokenize(engine, PROMPT, strlen(PROMPT), 1, 1, tokens, 64, &n), VLLM_OK);
        CHECK_STATUS(vllm_detokenize(engine, tokens, n, 1, text, sizeof text, &n_bytes), VLLM_OK);
        CHECK(strcmp(text, PROMPT) == 0, "round trip '%s'", text);
        CHECK_STATUS(vllm_token_to_piece(engine, tokens[0], 1, text, sizeof text, &n_bytes),
                     VLLM_OK);
        metrics.struct_size = sizeof metrics;
        CHECK_STATUS(vllm_engine_metrics(engine, &metrics), VLLM_OK);
        CHECK(metrics.num_requests_running >= 0, "running %d", metrics.num_requests_running);
    }
}

static void abort_by_id_then_greedy(job *j) {
    char id[32];
    vllm_sampling_params sp = sampling(200);
    snprintf(id, sizeof id, "victim-%d", j->index);
    CHECK_STATUS(vllm_request_submit(engine, id, PROMPT, NULL, 0, &sp, on_event, &j->push, NULL),
                 VLLM_OK);
    tokenizer_and_metrics(j);
    if (j->failed[0] != '\0') return;
    CHECK_STATUS(vllm_request_abort(engine, id), VLLM_OK);
    wait_terminal(&j->push);
    CHECK(j->push.finish_reason == VLLM_FINISH_ABORT || j->push.tokens == 200, "reason %d",
          j->push.finish_reason);
    CHECK(j->push.terminals == 1, "%d last events", j->push.terminals);
    pull_greedy(j);
}

static void run(job *j) {
    char own_error[64], copy[256];
    snprintf(own_error, sizeof own_error, "never-added-%d", j->index);
    CHECK_STATUS(vllm_request_abort(engine, own_error), VLLM_ERR_NOT_FOUND);
    switch (j->index % 4) {
    case 0: pull_greedy(j); break;
    case 1: push_greedy(j); break;
    case 2: cancel_then_greedy(j); break;
    default: abort_by_id_then_greedy(j); break;
    }
    if (j->failed[0] != '\0') return;
    CHECK_STATUS(vllm_request_abort(engine, own_error), VLLM_ERR_NOT_FOUND);
    vllm_last_error_copy(copy, sizeof copy);
    CHECK(strstr(copy, own_error) != NULL, "last error of another thread: %s", copy);
}

static void *thread_main(void *arg) {
    pthread_barrier_wait(&start); /* all threads start together */
    run(arg);
    return NULL;
}

int main(int argc, char **argv) {
    pthread_t threads[N_THREADS];
    job *jobs = calloc(N_THREADS, sizeof *jobs);
    vllm_engine_params params;
    vllm_metrics metrics;
    size_t unfinished = 1;
    int i, failures = 0;
    if (argc != 2 || jobs == NULL) {
        fprintf(stderr, "usage: %s MODEL_PATH\n", argv[0]);
        return 2;
    }
    model_path = argv[1];
    vllm_engine_params_init(&params, sizeof params);
    params.max_model_len = 256;
    if (vllm_engine_create(model_path, &params, &engine) != VLLM_OK ||
        vllm_engine_start_loop(engine) != VLLM_OK ||
        vllm_tokenize(engine, PROMPT, strlen(PROMPT), 1, 1, NULL, 0, &expected_tokens) != VLLM_ERR_BUFFER_TOO_SMALL) {
        fprintf(stderr, "set-up failed: %s\n", vllm_last_error());
        return 2;
    }
    pthread_barrier_init(&start, NULL, N_THREADS);
    for (i = 0; i < N_THREADS; i++) {
        jobs[i].index = i;
        pthread_mutex_init(&jobs[i].push.mutex, NULL);
        pthread_cond_init(&jobs[i].push.cond, NULL);
        pthread_create(&threads[i], NULL, thread_main, &jobs[i]);
    }
    for (i = 0; i < N_THREADS; i++) pthread_join(threads[i], NULL);
    for (i = 0; i < N_THREADS; i++) {
        if (jobs[i].failed[0] == '\0' && strcmp(jobs[i].text, jobs[0].text) != 0)
            snprintf(jobs[i].failed, sizeof jobs[i].failed, "greedy text '%.400s' vs thread 0's "
                     "'%.400s'", jobs[i].text, jobs[0].text);
        if (jobs[i].failed[0] != '\0') {
            printf("FAIL thread %d: %s\n", i, jobs[i].failed);
            failures++;
        }
    }
    metrics.struct_size = sizeof metrics;
    if (vllm_engine_num_unfinished(engine, &unfinished) != VLLM_OK || unfinished != 0 ||
        vllm_engine_metrics(engine, &metrics) != VLLM_OK || metrics.request_success_abort < 4) {
        printf("FAIL main: %zu unfinished, %lld aborted (%s)\n", unfinished,
               (long long)metrics.request_success_abort, vllm_last_error());
        failures++;
    }
    if (!failures) printf("PASS\n");
    vllm_engine_free(engine);
    vllm_shutdown();
    for (i = 0; i < N_THREADS; i++) {
        pthread_mutex_destroy(&jobs[i].push.mutex);
        pthread_cond_destroy(&jobs[i].push.cond);
    }
    pthread_barrier_destroy(&start);
    free(jobs);
    return failures ? 1 : 0;
}
