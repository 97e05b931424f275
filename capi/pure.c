/*
 * capi/pure.c - the functions of include/vllm.h that never need Python: the
 * thread-local last error, version, status strings, string free and the *_init
 * functions. capi/build.py pastes this file into both libraries: the loader
 * (libvllm.so, capi/loader.c) answers these itself, and the Python-backed runtime
 * library (capi/libvllm.c) uses the same helpers.
 */

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vllm.h"

#define PRINTF_LIKE(fmt, args) __attribute__((format(printf, fmt, args)))

/* ------------------------------------------------------------------------- */
/* Last error (thread-local)                                                  */
/* ------------------------------------------------------------------------- */

static _Thread_local char *tls_error;
static _Thread_local size_t tls_error_capacity;
static pthread_key_t error_key; /* frees a thread's message when the thread exits */
static pthread_once_t error_key_once = PTHREAD_ONCE_INIT;

static void make_error_key(void) { (void)pthread_key_create(&error_key, free); }

static void set_error(const char *message) {
    size_t n = strlen(message);
    if (n + 1 > tls_error_capacity) {
        char *grown = realloc(tls_error, n + 1);
        if (grown != NULL) {
            tls_error = grown;
            tls_error_capacity = n + 1;
            pthread_once(&error_key_once, make_error_key);
            (void)pthread_setspecific(error_key, grown);
        } else if (tls_error_capacity == 0) {
            return;
        } else {
            n = tls_error_capacity - 1;  /* out of memory: keep what fits */
        }
    }
    memcpy(tls_error, message, n);
    tls_error[n] = '\0';
}

__attribute__((unused)) static void clear_error(void) {
    if (tls_error != NULL) tls_error[0] = '\0';
}

PRINTF_LIKE(2, 3)
static vllm_status fail(vllm_status status, const char *format, ...) {
    char message[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    set_error(message);
    return status;
}

__attribute__((unused)) static vllm_status null_argument(const char *function, const char *name) {
    return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: %s is NULL", function, name);
}

/* This library's own message (the loader's: before the runtime library is loaded). */
static const char *own_last_error(void) { return tls_error != NULL ? tls_error : ""; }

VLLM_API size_t vllm_last_error_copy(char *buf, size_t size) {
    const char *message = vllm_last_error();
    size_t n = strlen(message);
    if (buf != NULL && size > 0) {
        size_t k = n < size - 1 ? n : size - 1;
        memcpy(buf, message, k);
        buf[k] = '\0';
    }
    return n;
}

/* ------------------------------------------------------------------------- */
/* Pure C                                                                     */
/* ------------------------------------------------------------------------- */

VLLM_API const char *vllm_version(void) { return VLLM_LIB_VERSION; }

VLLM_API uint32_t vllm_abi_version(void) { return VLLM_ABI_VERSION; }

VLLM_API const char *vllm_status_string(vllm_status status) {
    static const char *const names[] = {
        "VLLM_OK",
        "VLLM_ERR_INVALID_ARGUMENT",
        "VLLM_ERR_BUFFER_TOO_SMALL",
        "VLLM_ERR_MODEL_LOAD",
        "VLLM_ERR_UNSUPPORTED",
        "VLLM_ERR_NOT_FOUND",
        "VLLM_ERR_INVALID_HANDLE",
        "VLLM_ERR_OUT_OF_RESOURCES",
        "VLLM_ERR_RUNTIME_INIT",
        "VLLM_ERR_INTERNAL",
        "VLLM_ERR_TIMEOUT",
        "VLLM_END_OF_STREAM",
        "VLLM_ERR_INVALID_STATE",
        "VLLM_ERR_CANCELLED",
        "VLLM_ERR_ENGINE_DEAD",
    };
    if (status < 0 || (size_t)status >= sizeof names / sizeof names[0]) return "VLLM_ERR_UNKNOWN";
    return names[status];
}

VLLM_API void vllm_string_free(char *str) { free(str); }

/* Writes the first min(size, full) bytes of defaults over dst, struct_size being that
 * count: a caller built against an older header passes its smaller sizeof. */
static void write_defaults(void *dst, size_t size, void *defaults, size_t full) {
    size_t n = size < full ? size : full;
    if (dst == NULL || n < sizeof(uint32_t)) return;
    *(uint32_t *)defaults = (uint32_t)n;
    memcpy(dst, defaults, n);
}

/* Defaults of engine/config.py (EngineConfig): 0 / NULL where its default is None (the
 * engine resolves it) or the flag's "auto"; tests/test_config_frozen.py checks each. */
VLLM_API void vllm_engine_params_init(vllm_engine_params *params, size_t size) {
    vllm_engine_params d;
    memset(&d, 0, sizeof d);
    d.block_size = 16;
    d.enable_prefix_caching = 1;
    d.enable_chunked_prefill = 1;
    d.gpu_memory_utilization = 0.9f;
    d.tensor_parallel_size = 1;
    write_defaults(params, size, &d, sizeof d);
}

/* Defaults of engine/sampling_params.py (vLLM's SamplingParams). */
VLLM_API void vllm_sampling_params_init(vllm_sampling_params *params, size_t size) {
    vllm_sampling_params d;
    memset(&d, 0, sizeof d);
    d.max_tokens = 16;
    d.temperature = 1.0f;
    d.top_p = 1.0f;
    d.skip_special_tokens = 1;
    d.repetition_penalty = 1.0f;
    d.logprobs = -1;
    d.n = 1;
    d.thinking_token_budget = -1;
    write_defaults(params, size, &d, sizeof d);
}

