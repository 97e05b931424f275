/*
 * tests/c/capi_test.c - drives include/vllm.h from C for tests/test_capi.py.
 *
 * usage: capi_test MODEL_PATH [CASE...]   (no CASE: all cases)
 * Prints "PASS <case>" or "FAIL <case>: <why>" per case; exits 1 if any failed.
 * One engine is shared by the cases that only need a working engine.
 */

#define _POSIX_C_SOURCE 200809L /* pthreads */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vllm.h"

static _Thread_local char why[2048]; /* the failure message of CHECK */
static const char *model_path;
static vllm_engine *shared_engine;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            int n_ = snprintf(why, sizeof why, "line %d: ", __LINE__);          \
            snprintf(why + n_, sizeof why - (size_t)n_, __VA_ARGS__);           \
            return why;                                                         \
        }                                                                       \
    } while (0)

#define CHECK_STATUS(call, want)                                                \
    do {                                                                        \
        vllm_status got_ = (call);                                              \
        CHECK(got_ == (want), "%s returned %s, want %s (last error: %s)", #call, \
              vllm_status_string(got_), vllm_status_string(want),              \
              vllm_last_error());                                               \
    } while (0)

static vllm_engine *engine(void) {
    if (shared_engine == NULL) {
        vllm_engine_params params;
        vllm_engine_params_init(&params, sizeof params);
        params.max_model_len = 512;
        if (vllm_engine_create(model_path, &params, &shared_engine) != VLLM_OK) {
            fprintf(stderr, "cannot create the shared engine: %s\n", vllm_last_error());
            exit(2);
        }
    }
    return shared_engine;
}

static vllm_sampling_params greedy(int32_t max_tokens) {
    vllm_sampling_params sp;
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.temperature = 0.0f;
    sp.max_tokens = max_tokens;
    sp.ignore_eos = 1;
    return sp;
}

/* Result of running requests to completion with vllm_engine_step. */
typedef struct {
    int32_t tokens[256];
    size_t n_tokens;
    char text[4096];
    int finished_outputs;
    int32_t finish_reason;
    int32_t num_prompt_tokens;
    int32_t num_output_tokens;
} run_result;

static void collect(const vllm_request_output *out, run_result *r) {
    size_t i;
    for (i = 0; i < out->n_token_ids && r->n_tokens < 256; i++)
        r->tokens[r->n_tokens++] = out->token_ids[i];
    strncat(r->text, out->text, sizeof r->text - strlen(r->text) - 1);
    r->num_prompt_tokens = out->num_prompt_tokens;
    r->num_output_tokens = out->num_output_tokens;
    if (out->finished) {
        r->finished_outputs++;
        r->finish_reason = out->finish_reason;
    }
}

/* Steps until nothing is unfinished; results[i] collects request id ids[i]. */
static const char *run_all(vllm_engine *e, const char *const *ids, run_result *results, int n) {
    size_t unfinished = 1;
    int steps = 0, i;
    memset(results, 0, sizeof *results * (size_t)n);
    while (unfinished > 0) {
        const vllm_request_output *outs;
        size_t n_outs, k;
        CHECK(++steps < 1000, "no end after 1000 steps");
        CHECK_STATUS(vllm_engine_step(e, &outs, &n_outs), VLLM_OK);
        for (k = 0; k < n_outs; k++)
            for (i = 0; i < n; i++)
                if (strcmp(outs[k].request_id, ids[i]) == 0) collect(&outs[k], &results[i]);
        CHECK_STATUS(vllm_engine_num_unfinished(e, &unfinished), VLLM_OK);
    }
    for (i = 0; i < n; i++)
        CHECK(results[i].finished_outputs == 1, "%s: %d finished outputs", ids[i],
              results[i].finished_outputs);
    return NULL;
}

static const char *case_version(void) {
    CHECK(vllm_abi_version() == VLLM_ABI_VERSION, "abi %u", (unsigned)vllm_abi_version());
    CHECK(strlen(vllm_version()) > 0, "empty version");
    CHECK(strcmp(vllm_status_string(VLLM_ERR_MODEL_LOAD), "VLLM_ERR_MODEL_LOAD") == 0, "name");
    CHECK(strcmp(vllm_status_string(1234), "VLLM_ERR_UNKNOWN") == 0, "unknown status name");
    return NULL;
}

static const char *case_init(void) {
    CHECK_STATUS(vllm_init(), VLLM_OK);
    CHECK_STATUS(vllm_init(), VLLM_OK);
    return NULL;
}

static const char *case_missing_model(void) {
    vllm_engine *e = (vllm_engine *)1;
    CHECK_STATUS(vllm_engine_create("/nonexistent/dir/model.gguf", NULL, &e), VLLM_ERR_MODEL_LOAD);
    CHECK(e == NULL, "out not cleared");
    CHECK(strstr(vllm_last_error(), "/nonexistent/dir/model.gguf") != NULL, "message: %s",
          vllm_last_error());
    return NULL;
}

static const char *case_last_error_copy(void) {
    char small[8];
    size_t full;
    vllm_engine *e;
    CHECK_STATUS(vllm_engine_create(NULL, NULL, &e), VLLM_ERR_INVALID_ARGUMENT);
    full = vllm_last_error_copy(small, sizeof small);
    CHECK(full == strlen(vllm_last_error()) && full > sizeof small, "length %zu", full);
    CHECK(strlen(small) == sizeof small - 1, "not truncated: %s", small);
    CHECK(strncmp(small, vllm_last_error(), sizeof small - 1) == 0, "wrong prefix");
    CHECK(vllm_last_error_copy(NULL, 0) == full, "NULL buffer");
    CHECK_STATUS(vllm_engine_num_unfinished(engine(), &full), VLLM_OK);
    CHECK(vllm_last_error()[0] == '\0', "not cleared by a successful call");
    return NULL;
}

static const char *case_null_args(void) {
    vllm_engine *e = engine();
    vllm_engine *out;
    vllm_model_info info;
    vllm_engine_params params;
    vllm_sampling_params sp;
    size_t n;
    char *str;
    const vllm_request_output *outs;
    int32_t ids[1] = {1};
    CHECK_STATUS(vllm_engine_create(NULL, NULL, &out), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_engine_create(model_path, NULL, NULL), VLLM_ERR_INVALID_ARGUMENT);
    vllm_engine_params_init(&params, sizeof params);
    params.struct_size = 4;
    CHECK_STATUS(vllm_engine_create(model_path, &params, &out), VLLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(vllm_last_error(), "struct_size") != NULL, "%s", vllm_last_error());
    CHECK_STATUS(vllm_engine_model_info(NULL, &info), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_engine_model_info(e, NULL), VLLM_ERR_INVALID_ARGUMENT);
    info.struct_size = 0;
    CHECK_STATUS(vllm_engine_model_info(e, &info), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_tokenize(e, NULL, 3, 1, 1, NULL, 0, &n), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_tokenize(e, "x", strlen("x"), 1, 1, NULL, 0, NULL), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_tokenize(e, "x", strlen("x"), 1, 1, NULL, 4, &n), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_detokenize(e, NULL, 3, 1, NULL, 0, &n), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_detokenize(e, ids, 1, 1, NULL, 8, &n), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_chat_template_apply(e, NULL, 1, &str), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_chat_template_apply(e, "[]", 1, NULL), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_request_add(NULL, "r", "hi", NULL, 0, NULL), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_request_add(e, NULL, "hi", NULL, 0, NULL), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_request_add(e, "r", NULL, NULL, 0, NULL), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_request_add(e, "r", "hi", ids, 1, NULL), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_request_add(e, "r", NULL, NULL, 2, NULL), VLLM_ERR_INVALID_ARGUMENT);
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.n_stop_token_ids = 2;
    CHECK_STATUS(vllm_request_add(e, "r", "hi", NULL, 0, &sp), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_request_abort(e, NULL), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_engine_step(e, NULL, &n), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_engine_step(e, &outs, NULL), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_engine_step(NULL, &outs, &n), VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_engine_num_unfinished(e, NULL), VLLM_ERR_INVALID_ARGUMENT);
    vllm_engine_free(NULL);
    vllm_string_free(NULL);
    CHECK_STATUS(vllm_engine_num_unfinished(e, &n), VLLM_OK);
    CHECK(n == 0, "%zu requests left behind by failed calls", n);
    return NULL;
}

static const char *case_stale_handle(void) {
    vllm_engine *e;
    vllm_model_info info;
    size_t n;
    const vllm_request_output *outs;
    CHECK_STATUS(vllm_engine_create(model_path, NULL, &e), VLLM_OK);
    vllm_engine_free(e);
    info.struct_size = sizeof info;
    CHECK_STATUS(vllm_engine_model_info(e, &info), VLLM_ERR_INVALID_HANDLE);
    CHECK_STATUS(vllm_tokenize(e, "hi", strlen("hi"), 1, 1, NULL, 0, &n), VLLM_ERR_INVALID_HANDLE);
    CHECK_STATUS(vllm_request_add(e, "r", "hi", NULL, 0, NULL), VLLM_ERR_INVALID_HANDLE);
    CHECK_STATUS(vllm_engine_step(e, &outs, &n), VLLM_ERR_INVALID_HANDLE);
    CHECK_STATUS(vllm_engine_step((vllm_engine *)(uintptr_t)987654, &outs, &n),
                 VLLM_ERR_INVALID_HANDLE);
    vllm_engine_free(e); /* twice: no crash */
    return NULL;
}

static const char *case_model_info(void) {
    vllm_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK_STATUS(vllm_engine_model_info(engine(), &info), VLLM_OK);
    CHECK(info.struct_size == sizeof info, "struct_size changed");
    CHECK(info.vocab_size > 1000, "vocab_size %d", info.vocab_size);
    CHECK(info.max_model_len == 512, "max_model_len %d", info.max_model_len);
    CHECK(info.eos_token_id >= 0 && info.eos_token_id < info.vocab_size, "eos %d",
          info.eos_token_id);
    CHECK(info.bos_token_id >= -1 && info.bos_token_id < info.vocab_size, "bos %d",
          info.bos_token_id);
    CHECK(strcmp(info.architecture, "llama") == 0, "architecture %s", info.architecture);
    CHECK(info.name != NULL && info.name[0] != '\0', "empty name");
    return NULL;
}

static const char *case_tokenize_roundtrip(void) {
    const char *text = "Hello, world! Paris is the capital of France.";
    int32_t tokens[64];
    size_t n = 0, n2 = 0, n_bytes = 0;
    char buf[256];
    CHECK_STATUS(vllm_tokenize(engine(), text, strlen(text), 0, 1, NULL, 0, &n), VLLM_ERR_BUFFER_TOO_SMALL);
    CHECK(n > 3 && n < 64, "n_tokens %zu", n);
    CHECK_STATUS(vllm_tokenize(engine(), text, strlen(text), 0, 1, tokens, n - 1, &n2), VLLM_ERR_BUFFER_TOO_SMALL);
    CHECK_STATUS(vllm_tokenize(engine(), text, strlen(text), 0, 1, tokens, n, &n2), VLLM_OK);
    CHECK(n2 == n, "second call %zu tokens, first %zu", n2, n);
    CHECK_STATUS(vllm_detokenize(engine(), tokens, n, 1, NULL, 0, &n_bytes),
                 VLLM_ERR_BUFFER_TOO_SMALL);
    CHECK(n_bytes == strlen(text), "n_bytes %zu", n_bytes);
    CHECK_STATUS(vllm_detokenize(engine(), tokens, n, 1, buf, n_bytes, &n_bytes),
                 VLLM_ERR_BUFFER_TOO_SMALL); /* no room for the NUL */
    CHECK_STATUS(vllm_detokenize(engine(), tokens, n, 1, buf, sizeof buf, &n_bytes), VLLM_OK);
    CHECK(strcmp(buf, text) == 0, "round trip gave '%s'", buf);
    CHECK_STATUS(vllm_detokenize(engine(), tokens, 0, 1, buf, sizeof buf, &n_bytes), VLLM_OK);
    CHECK(n_bytes == 0 && buf[0] == '\0', "empty detokenize");
    tokens[0] = -5;
    CHECK_STATUS(vllm_detokenize(engine(), tokens, 1, 1, buf, sizeof buf, &n_bytes),
                 VLLM_ERR_INVALID_ARGUMENT);
    return NULL;
}

static const char *case_chat_template(void) {
    char *out = NULL;
    const char *messages = "[{\"role\": \"system\", \"content\": \"Be brief.\"},"
                           " {\"role\": \"user\", \"content\": \"Hi \\\"there\\\"\"}]";
    CHECK_STATUS(vllm_chat_template_apply(engine(), messages, 1, &out), VLLM_OK);
    CHECK(out != NULL && strstr(out, "Hi \"there\"") != NULL && strstr(out, "Be brief.") != NULL,
          "rendered: %s", out ? out : "(null)");
    CHECK(strlen(out) > strlen("Be brief.Hi \"there\""), "no template markup: %s", out);
    vllm_string_free(out);
    CHECK_STATUS(vllm_chat_template_apply(engine(), "[{\"role\": ", 1, &out),
                 VLLM_ERR_INVALID_ARGUMENT);
    CHECK(out == NULL, "out set on failure");
    CHECK_STATUS(vllm_chat_template_apply(engine(), "{\"role\": \"user\"}", 1, &out),
                 VLLM_ERR_INVALID_ARGUMENT);
    return NULL;
}

/* The same prompt by text and by token ids, greedy, in one batch: same tokens. */
static const char *case_generate(void) {
    const char *prompt = "The capital of France is";
    const char *ids[2] = {"by-text", "by-ids"};
    int32_t tokens[64];
    size_t n;
    run_result results[2];
    vllm_sampling_params sp = greedy(8);
    const char *failed;
    CHECK_STATUS(vllm_tokenize(engine(), prompt, strlen(prompt), 1, 1, tokens, 64, &n), VLLM_OK);
    CHECK_STATUS(vllm_request_add(engine(), ids[0], prompt, NULL, 0, &sp), VLLM_OK);
    CHECK_STATUS(vllm_request_add(engine(), ids[1], NULL, tokens, n, &sp), VLLM_OK);
    CHECK_STATUS(vllm_request_add(engine(), ids[1], "dup", NULL, 0, &sp),
                 VLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(vllm_engine_num_unfinished(engine(), &n), VLLM_OK);
    CHECK(n == 2, "%zu unfinished", n);
    if ((failed = run_all(engine(), ids, results, 2)) != NULL) return failed;
    CHECK(results[0].finish_reason == VLLM_FINISH_LENGTH, "reason %d", results[0].finish_reason);
    CHECK(results[0].n_tokens == 8 && results[0].num_output_tokens == 8, "%zu tokens, count %d",
          results[0].n_tokens, results[0].num_output_tokens);
    CHECK(results[0].num_prompt_tokens == results[1].num_prompt_tokens, "prompt %d vs %d",
          results[0].num_prompt_tokens, results[1].num_prompt_tokens);
    CHECK(memcmp(results[0].tokens, results[1].tokens, 8 * sizeof(int32_t)) == 0,
          "text and token-id prompts differ: '%s' vs '%s'", results[0].text, results[1].text);
    CHECK(strlen(results[0].text) > 0 && strcmp(results[0].text, results[1].text) == 0,
          "texts '%s' vs '%s'", results[0].text, results[1].text);
    return NULL;
}

/* A stop token (the greedy first token) ends the request at once with STOP. */
static const char *case_stop_token(void) {
    const char *ids[1] = {"first"};
    run_result r[1];
    vllm_sampling_params sp = greedy(1);
    const char *failed;
    int32_t stop;
    CHECK_STATUS(vllm_request_add(engine(), ids[0], "One, two, three,", NULL, 0, &sp), VLLM_OK);
    if ((failed = run_all(engine(), ids, r, 1)) != NULL) return failed;
    stop = r[0].tokens[0];
    sp = greedy(16);
    sp.stop_token_ids = &stop;
    sp.n_stop_token_ids = 1;
    ids[0] = "stopped";
    CHECK_STATUS(vllm_request_add(engine(), ids[0], "One, two, three,", NULL, 0, &sp), VLLM_OK);
    if ((failed = run_all(engine(), ids, r, 1)) != NULL) return failed;
    CHECK(r[0].finish_reason == VLLM_FINISH_STOP, "reason %d", r[0].finish_reason);
    CHECK(r[0].num_output_tokens == 1, "%d output tokens", r[0].num_output_tokens);
    return NULL;
}

static const char *case_abort(void) {
    const char *ids[1] = {"to-abort"};
    const vllm_request_output *outs;
    size_t n, k;
    int steps;
    run_result r[1];
    vllm_sampling_params sp = greedy(200);
    const char *failed;
    CHECK_STATUS(vllm_request_add(engine(), ids[0], "Count: 1, 2, 3,", NULL, 0, &sp), VLLM_OK);
    for (steps = 0; steps < 3; steps++) {
        CHECK_STATUS(vllm_engine_step(engine(), &outs, &n), VLLM_OK);
        for (k = 0; k < n; k++) CHECK(!outs[k].finished, "finished before the abort");
    }
    CHECK_STATUS(vllm_request_abort(engine(), ids[0]), VLLM_OK);
    CHECK_STATUS(vllm_request_abort(engine(), ids[0]), VLLM_ERR_NOT_FOUND);
    if ((failed = run_all(engine(), ids, r, 1)) != NULL) return failed;
    CHECK(r[0].finish_reason == VLLM_FINISH_ABORT, "reason %d", r[0].finish_reason);
    CHECK(r[0].num_output_tokens > 0 && r[0].num_output_tokens < 200, "%d output tokens",
          r[0].num_output_tokens);
    CHECK_STATUS(vllm_request_abort(engine(), "never-added"), VLLM_ERR_NOT_FOUND);
    CHECK_STATUS(vllm_engine_step(engine(), &outs, &n), VLLM_OK);
    CHECK(n == 0 && outs == NULL, "%zu outputs from an idle engine", n);
    return NULL;
}

static const char *case_bad_sampling(void) {
    const char *ids[1] = {"after-bad"};
    run_result r[1];
    vllm_sampling_params sp;
    const char *failed;
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.temperature = 5.0f;
    CHECK_STATUS(vllm_request_add(engine(), "bad", "Hello", NULL, 0, &sp),
                 VLLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(vllm_last_error(), "temperature must be in [0, 2], got 5.0.") != NULL, "%s",
          vllm_last_error());
    sp = greedy(4);
    sp.top_p = 0.0f;
    CHECK_STATUS(vllm_request_add(engine(), "bad", "Hello", NULL, 0, &sp),
                 VLLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(vllm_last_error(), "top_p must be in (0, 1], got 0.0.") != NULL, "%s",
          vllm_last_error());
    sp = greedy(4);
    CHECK_STATUS(vllm_request_add(engine(), ids[0], "Hello", NULL, 0, &sp), VLLM_OK);
    if ((failed = run_all(engine(), ids, r, 1)) != NULL) return failed;
    CHECK(r[0].num_output_tokens == 4, "%d tokens", r[0].num_output_tokens);
    return NULL;
}

static const char *case_default_params(void) {
    const char *ids[1] = {"defaults"};
    run_result r[1];
    const char *failed;
    CHECK_STATUS(vllm_request_add(engine(), ids[0], "Hello", NULL, 0, NULL), VLLM_OK);
    if ((failed = run_all(engine(), ids, r, 1)) != NULL) return failed;
    CHECK(r[0].num_output_tokens >= 1 && r[0].num_output_tokens <= 16, "%d tokens (max 16)",
          r[0].num_output_tokens);
    return NULL;
}

/* Each thread creates, uses and frees its own engine; errors stay per thread. */
typedef struct {
    char failed[2048]; /* "" when the thread passed */
    run_result result;
} thread_job;

static const char *own_engine_generate(thread_job *job) {
    const char *ids[1] = {"threaded"};
    vllm_engine_params params;
    vllm_sampling_params sp = greedy(6);
    vllm_engine *e;
    const char *failed;
    vllm_engine_params_init(&params, sizeof params);
    params.max_model_len = 256;
    CHECK_STATUS(vllm_engine_create(model_path, &params, &e), VLLM_OK);
    CHECK_STATUS(vllm_request_abort(e, "never-added"), VLLM_ERR_NOT_FOUND); /* this thread's */
    CHECK_STATUS(vllm_request_add(e, ids[0], "The capital of France is", NULL, 0, &sp), VLLM_OK);
    failed = run_all(e, ids, &job->result, 1);
    vllm_engine_free(e);
    return failed;
}

static void *thread_main(void *arg) {
    thread_job *job = arg;
    const char *failed = own_engine_generate(job);
    snprintf(job->failed, sizeof job->failed, "%s", failed != NULL ? failed : "");
    return NULL;
}

static const char *case_threads(void) {
    pthread_t threads[2];
    thread_job jobs[2];
    vllm_engine *e;
    int i;
    memset(jobs, 0, sizeof jobs);
    CHECK_STATUS(vllm_engine_create(NULL, NULL, &e), VLLM_ERR_INVALID_ARGUMENT);
    for (i = 0; i < 2; i++)
        CHECK(pthread_create(&threads[i], NULL, thread_main, &jobs[i]) == 0, "pthread_create");
    for (i = 0; i < 2; i++) pthread_join(threads[i], NULL);
    CHECK(strstr(vllm_last_error(), "model_path is NULL") != NULL,
          "this thread's error changed: %s", vllm_last_error());
    for (i = 0; i < 2; i++) CHECK(jobs[i].failed[0] == '\0', "thread %d: %s", i, jobs[i].failed);
    CHECK(jobs[0].result.num_output_tokens == 6 &&
              strcmp(jobs[0].result.text, jobs[1].result.text) == 0,
          "threads disagree: '%s' vs '%s'", jobs[0].result.text, jobs[1].result.text);
    return NULL;
}

typedef struct {
    const char *name;
    const char *(*run)(void);
} test_case;

static const test_case cases[] = {
    {"version", case_version},
    {"init", case_init},
    {"missing_model", case_missing_model},
    {"last_error_copy", case_last_error_copy},
    {"null_args", case_null_args},
    {"stale_handle", case_stale_handle},
    {"model_info", case_model_info},
    {"tokenize_roundtrip", case_tokenize_roundtrip},
    {"chat_template", case_chat_template},
    {"generate", case_generate},
    {"stop_token", case_stop_token},
    {"abort", case_abort},
    {"bad_sampling", case_bad_sampling},
    {"default_params", case_default_params},
    {"threads", case_threads},
};

static int selected(const char *name, int argc, char **argv) {
    int i;
    if (argc <= 2) return 1;
    for (i = 2; i < argc; i++)
        if (strcmp(argv[i], name) == 0) return 1;
    return 0;
}

int main(int argc, char **argv) {
    size_t i;
    int failures = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_PATH [CASE...]\n", argv[0]);
        return 2;
    }
    model_path = argv[1];
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *failed;
        if (!selected(cases[i].name, argc, argv)) continue;
        failed = cases[i].run();
        if (failed != NULL) {
            failures++;
            printf("FAIL %s: %s\n", cases[i].name, failed);
        } else {
            printf("PASS %s\n", cases[i].name);
        }
        fflush(stdout);
    }
    vllm_engine_free(shared_engine);
    vllm_shutdown();
    return failures ? 1 : 0;
}
