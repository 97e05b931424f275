/*
 * tests/c/step_threads_test.c - 4 threads add requests to one caller-driven engine and
 * all call vllm_engine_step at once. tests/test_capi_step_threads.py
 * builds it with -fsanitize=address.
 *
 * usage: step_threads_test MODEL_PATH
 * Prints "PASS" or one "FAIL ..." line per failure; exits 1 on failure.
 *
 * Each thread adds a greedy request (PROMPT, GREEDY_TOKENS tokens) and a counted one
 * (ignore_eos, 3 + index tokens), then steps until both finished, yielding between a
 * step and reading its outputs so that other threads step meanwhile. Checks: every
 * output a thread gets is its own (routing), cumulative token counts, exactly one
 * finished output per request, greedy texts equal to a single-threaded run. Before
 * that, the thread that added nothing: a thread that only steps while another thread's
 * request runs gets VLLM_ERR_INVALID_STATE once the work is done, and the adder then gets
 * its outputs.
 */

#define _POSIX_C_SOURCE 200809L /* pthreads, barriers */

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vllm.h"

#define N_THREADS 4
#define GREEDY_TOKENS 8
#define PROMPT "The capital of France is"

typedef struct {
    int index;
    char failed[1024];
    char text[2][512];
    int tokens[2], finished[2];
} job;

static vllm_engine *engine;
static pthread_barrier_t start;

#define CHECK(cond, ...)                                                           \
    do {                                                                           \
        if (!(cond)) {                                                             \
            int n_ = snprintf(j->failed, sizeof j->failed, "line %d: ", __LINE__); \
            snprintf(j->failed + n_, sizeof j->failed - (size_t)n_, __VA_ARGS__);  \
            return NULL;                                                           \
        }                                                                          \
    } while (0)

static vllm_sampling_params sampling(int32_t max_tokens, int32_t ignore_eos) {
    vllm_sampling_params sp;
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.temperature = 0.0f;
    sp.max_tokens = max_tokens;
    sp.ignore_eos = ignore_eos;
    return sp;
}

static void *stepper(void *arg) {
    job *j = arg;
    char ids[2][32];
    vllm_sampling_params greedy = sampling(GREEDY_TOKENS, 0);
    vllm_sampling_params counted = sampling(3 + j->index, 1);
    snprintf(ids[0], sizeof ids[0], "t%d-greedy", j->index);
    snprintf(ids[1], sizeof ids[1], "t%d-counted", j->index);
    pthread_barrier_wait(&start);
    CHECK(vllm_request_add(engine, ids[0], PROMPT, NULL, 0, &greedy) == VLLM_OK, "add: %s",
          vllm_last_error());
    CHECK(vllm_request_add(engine, ids[1], "Once upon a time", NULL, 0, &counted) == VLLM_OK,
          "add: %s", vllm_last_error());
    while (!j->finished[0] || !j->finished[1]) {
        const vllm_request_output *out = NULL;
        size_t n = 0;
        CHECK(vllm_engine_step(engine, &out, &n) == VLLM_OK, "step: %s", vllm_last_error());
        sched_yield(); /* others step while this thread reads its outputs */
        for (size_t i = 0; i < n; i++) {
            int k = strcmp(out[i].request_id, ids[0]) == 0   ? 0
                    : strcmp(out[i].request_id, ids[1]) == 0 ? 1
                                                              : -1;
            CHECK(k >= 0, "thread %d got %s's output", j->index, out[i].request_id);
            CHECK(!j->finished[k], "%s: an output after its last", ids[k]);
            strncat(j->text[k], out[i].text, sizeof j->text[k] - strlen(j->text[k]) - 1);
            j->tokens[k] += (int)out[i].n_token_ids;
            CHECK(out[i].num_output_tokens == j->tokens[k], "%s: num_output_tokens %d, got %d",
                  ids[k], out[i].num_output_tokens, j->tokens[k]);
            j->finished[k] = out[i].finished;
        }
    }
    CHECK(j->tokens[1] == 3 + j->index, "%s: %d tokens", ids[1], j->tokens[1]);
    return NULL;
}

static char orphan_error[512];

/* Steps an engine whose only request another thread added, until refused. */
static void *only_steps(void *arg) {
    vllm_status *last = arg;
    const vllm_request_output *out;
    size_t n;
    for (int i = 0; i < 64 && (*last = vllm_engine_step(engine, &out, &n)) == VLLM_OK; i++)
        if (n > 0) *last = VLLM_ERR_INTERNAL; /* it must never get another thread's output */
    vllm_last_error_copy(orphan_error, sizeof orphan_error);
    return NULL;
}

static int orphan_check(void) {
    vllm_sampling_params sp = sampling(2, 1);
    pthread_t thread;
    vllm_status last = VLLM_OK;
    const vllm_request_output *out;
    size_t n, unfinished = 0;
    int tokens = 0, finished = 0;
    if (vllm_request_add(engine, "mine", PROMPT, NULL, 0, &sp) != VLLM_OK) return 0;
    pthread_create(&thread, NULL, only_steps, &last);
    pthread_join(thread, NULL);
    if (last != VLLM_ERR_INVALID_STATE || strstr(orphan_error, "other threads") == NULL) {
        printf("FAIL orphan: the stepping thread got %s (%s)\n", vllm_status_string(last),
               orphan_error);
        return 0;
    }
    while (!finished) {
        if (vllm_engine_step(engine, &out, &n) != VLLM_OK) return 0;
        for (size_t i = 0; i < n; i++) {
            tokens += (int)out[i].n_token_ids;
            finished = out[i].finished;
        }
    }
    vllm_engine_num_unfinished(engine, &unfinished);
    if (tokens != 2 || unfinished != 0) {
        printf("FAIL orphan: %d tokens, %zu unfinished\n", tokens, unfinished);
        return 0;
    }
    return 1;
}

static int reference(char *text, size_t size) {
    vllm_sampling_params sp = sampling(GREEDY_TOKENS, 0);
    size_t left = 1;
    text[0] = '\0';
    if (vllm_request_add(engine, "reference", PROMPT, NULL, 0, &sp) != VLLM_OK) return 0;
    while (left > 0) {
        const vllm_request_output *out;
        size_t n;
        if (vllm_engine_step(engine, &out, &n) != VLLM_OK) return 0;
        for (size_t i = 0; i < n; i++) strncat(text, out[i].text, size - strlen(text) - 1);
        if (vllm_engine_num_unfinished(engine, &left) != VLLM_OK) return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    static job jobs[N_THREADS];
    pthread_t threads[N_THREADS];
    char expected[512];
    size_t unfinished = 1;
    int failed = 0;
    if (argc != 2) return fprintf(stderr, "usage: %s MODEL_PATH\n", argv[0]), 2;
    if (vllm_engine_create(argv[1], NULL, &engine) != VLLM_OK ||
        !reference(expected, sizeof expected)) {
        printf("FAIL setup: %s\n", vllm_last_error());
        return 1;
    }
    if (!orphan_check()) failed = 1; /* first: its thread id is no earlier thread's */
    pthread_barrier_init(&start, NULL, N_THREADS);
    for (int i = 0; i < N_THREADS; i++) {
        jobs[i].index = i;
        pthread_create(&threads[i], NULL, stepper, &jobs[i]);
    }
    for (int i = 0; i < N_THREADS; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < N_THREADS; i++) {
        if (jobs[i].failed[0] != '\0') {
            printf("FAIL thread %d: %s\n", i, jobs[i].failed);
            failed = 1;
        } else if (strcmp(jobs[i].text[0], expected) != 0) {
            printf("FAIL thread %d: greedy \"%s\" != \"%s\"\n", i, jobs[i].text[0], expected);
            failed = 1;
        }
    }
    vllm_engine_num_unfinished(engine, &unfinished);
    if (unfinished != 0) printf("FAIL: %zu unfinished\n", unfinished), failed = 1;
    vllm_engine_free(engine);
    vllm_shutdown();
    if (!failed) puts("PASS");
    return failed;
}
