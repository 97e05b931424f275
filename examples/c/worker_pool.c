/*
 * examples/c/worker_pool.c - a pool of threads driving one engine, both ways vllm.h
 * documents ("Thread safety"):
 *
 *   loop (default): the engine's background loop is the one stepping thread.
 *     N_SUBMITTERS threads submit requests (pull mode) and hand each request's handle
 *     to a queue; N_PULLERS threads take handles from it and pull the events with
 *     vllm_request_next. Any thread may submit, any thread may pull a handle (one at a
 *     time per handle).
 *   step: caller-driven. Outputs of vllm_engine_step go to the thread that added the
 *     request, so each worker adds its own requests and steps until they finished;
 *     every worker's step advances every request (continuous batching).
 *
 *   cc -std=c11 -Iinclude examples/c/worker_pool.c -Lbuild -lvllm -Wl,-rpath,$PWD/build \
 *      -pthread -o worker_pool
 *   ./worker_pool MODEL.gguf "The capital of France is" [loop|step]
 *
 * Prints, per request in order: "[pool-I] finish=REASON tokens=N" and its text, then
 * "unfinished=0" (vllm_engine_num_unfinished once every thread is done).
 */

#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "vllm.h"

#define N_SUBMITTERS 2
#define N_PULLERS 3
#define N_STEPPERS 3
#define N_REQUESTS 6 /* divisible by N_SUBMITTERS and N_STEPPERS */

typedef struct {
    char id[16];
    char text[4096];
    int tokens;
    int32_t finish_reason;
    vllm_request *handle; /* loop mode */
} request_state;

static vllm_engine *engine;
static const char *prompt;
static request_state requests[N_REQUESTS];
static vllm_sampling_params sp;

/* loop mode: the queue of submitted requests the pullers take */
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queued = PTHREAD_COND_INITIALIZER;
static request_state *queue[N_REQUESTS];
static int n_queued, n_taken, n_submitters_done;
static int failed;

static void fail(const char *what, const char *id) {
    pthread_mutex_lock(&mutex);
    fprintf(stderr, "%s %s: %s\n", what, id, vllm_last_error());
    failed = 1;
    pthread_mutex_unlock(&mutex);
}

static void *submitter(void *arg) {
    int first = (int)(size_t)arg * (N_REQUESTS / N_SUBMITTERS);
    for (int i = first; i < first + N_REQUESTS / N_SUBMITTERS; i++) {
        request_state *r = &requests[i];
        if (vllm_request_submit(engine, r->id, prompt, NULL, 0, &sp, NULL, NULL, &r->handle) !=
            VLLM_OK) {
            fail("submit", r->id);
            continue;
        }
        pthread_mutex_lock(&mutex);
        queue[n_queued++] = r;
        pthread_cond_signal(&queued);
        pthread_mutex_unlock(&mutex);
    }
    pthread_mutex_lock(&mutex);
    n_submitters_done++;
    pthread_cond_broadcast(&queued);
    pthread_mutex_unlock(&mutex);
    return NULL;
}

/* Takes requests off the queue until the submitters are done and it is empty. */
static void *puller(void *arg) {
    (void)arg;
    for (;;) {
        request_state *r;
        const vllm_event *ev;
        vllm_status st;
        pthread_mutex_lock(&mutex);
        while (n_taken == n_queued && n_submitters_done < N_SUBMITTERS)
            pthread_cond_wait(&queued, &mutex);
        r = n_taken < n_queued ? queue[n_taken++] : NULL;
        pthread_mutex_unlock(&mutex);
        if (r == NULL) return NULL;
        while ((st = vllm_request_next(r->handle, 1000, &ev)) != VLLM_END_OF_STREAM) {
            if (st == VLLM_ERR_TIMEOUT) continue;
            if (st != VLLM_OK) {
                fail("next", r->id);
                break;
            }
            strncat(r->text, ev->text, sizeof r->text - strlen(r->text) - 1);
            r->tokens = ev->num_output_tokens;
            if (ev->finished) r->finish_reason = ev->finish_reason;
        }
        vllm_request_free(r->handle);
    }
}

/* step mode: add this worker's requests, step until each has its last output. */
static void *stepper(void *arg) {
    int first = (int)(size_t)arg * (N_REQUESTS / N_STEPPERS), left = 0;
    for (int i = first; i < first + N_REQUESTS / N_STEPPERS; i++) {
        if (vllm_request_add(engine, requests[i].id, prompt, NULL, 0, &sp) != VLLM_OK)
            fail("add", requests[i].id);
        else
            left++;
    }
    while (left > 0) {
        const vllm_request_output *out;
        size_t n;
        if (vllm_engine_step(engine, &out, &n) != VLLM_OK) {
            fail("step", "");
            return NULL;
        }
        for (size_t k = 0; k < n; k++) { /* only this thread's requests */
            request_state *r = NULL;
            for (int i = first; i < first + N_REQUESTS / N_STEPPERS; i++)
                if (strcmp(requests[i].id, out[k].request_id) == 0) r = &requests[i];
            if (r == NULL) {
                fail("step returned a request of another thread:", out[k].request_id);
                return NULL;
            }
            strncat(r->text, out[k].text, sizeof r->text - strlen(r->text) - 1);
            r->tokens = out[k].num_output_tokens;
            if (out[k].finished) {
                r->finish_reason = out[k].finish_reason;
                left--;
            }
        }
    }
    return NULL;
}

static const char *reason_name(int32_t reason) {
    static const char *const names[] = {"none", "stop", "length", "abort", "error",
                                        "repetition"};
    return reason >= 0 && reason <= VLLM_FINISH_REPETITION ? names[reason] : "?";
}

static void run_threads(void *(*body)(void *), int n, pthread_t *threads) {
    for (int i = 0; i < n; i++) pthread_create(&threads[i], NULL, body, (void *)(size_t)i);
}

int main(int argc, char **argv) {
    vllm_engine_params params;
    pthread_t threads[N_SUBMITTERS + N_PULLERS + N_STEPPERS];
    int n_threads, step_mode;
    size_t unfinished = 1;
    if (argc < 3 || argc > 4 || (argc == 4 && strcmp(argv[3], "loop") != 0 &&
                                 strcmp(argv[3], "step") != 0)) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [loop|step]\n", argv[0]);
        return 2;
    }
    prompt = argv[2];
    step_mode = argc == 4 && strcmp(argv[3], "step") == 0;
    vllm_engine_params_init(&params, sizeof params);
    params.max_model_len = 1024;
    if (vllm_engine_create(argv[1], &params, &engine) != VLLM_OK ||
        (!step_mode && vllm_engine_start_loop(engine) != VLLM_OK)) {
        fprintf(stderr, "engine: %s\n", vllm_last_error());
        vllm_shutdown();
        return 1;
    }
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.temperature = 0.0f; /* greedy: every request gets the same text */
    sp.max_tokens = 32;
    for (int i = 0; i < N_REQUESTS; i++) snprintf(requests[i].id, sizeof requests[i].id,
                                                  "pool-%d", i);
    if (step_mode) {
        run_threads(stepper, N_STEPPERS, threads);
        n_threads = N_STEPPERS;
    } else {
        run_threads(submitter, N_SUBMITTERS, threads);
        run_threads(puller, N_PULLERS, threads + N_SUBMITTERS);
        n_threads = N_SUBMITTERS + N_PULLERS;
    }
    for (int i = 0; i < n_threads; i++) pthread_join(threads[i], NULL);

    for (int i = 0; i < N_REQUESTS; i++) {
        request_state *r = &requests[i];
        printf("[%s] finish=%s tokens=%d\n%s\n", r->id, reason_name(r->finish_reason),
               r->tokens, r->text);
    }
    if (vllm_engine_num_unfinished(engine, &unfinished) == VLLM_OK)
        printf("unfinished=%zu\n", unfinished);
    vllm_engine_free(engine);
    vllm_shutdown();
    return failed;
}
