/*
 * capi/libvllm.c - the C side of libvllm.so: every function of include/vllm.h.
 *
 * Two kinds of exports:
 *   - pure C (version, status strings, last error, string free, *_init): they never
 *     start the Python runtime;
 *   - shims: check their arguments in C (NULL pointers, struct_size, capacity vs
 *     buffer), start the runtime once, then call the Python side through the
 *     glue_* functions of capi/glue.h.
 *
 * This file is not compiled on its own: capi/build.py pastes it into the C file
 * that cffi generates (after Python.h and cffi's embedding support, which provides
 * cffi_start_python()), with VLLM_LIB_VERSION and VLLM_BUILD_PYTHON defined.
 */

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "glue.h"
#include "vllm.h"

#define PRINTF_LIKE(fmt, args) __attribute__((format(printf, fmt, args)))

/* ------------------------------------------------------------------------- */
/* Last error (thread-local)                                                  */
/* ------------------------------------------------------------------------- */

static _Thread_local char *tls_error;
static _Thread_local size_t tls_error_capacity;

static void set_error(const char *message) {
    size_t n = strlen(message);
    if (n + 1 > tls_error_capacity) {
        char *grown = realloc(tls_error, n + 1);
        if (grown != NULL) {
            tls_error = grown;
            tls_error_capacity = n + 1;
        } else if (tls_error_capacity == 0) {
            return;
        } else {
            n = tls_error_capacity - 1;  /* out of memory: keep what fits */
        }
    }
    memcpy(tls_error, message, n);
    tls_error[n] = '\0';
}

static void clear_error(void) {
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

static vllm_status null_argument(const char *function, const char *name) {
    return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: %s is NULL", function, name);
}

void glue_set_error(const char *message) { set_error(message); }

VLLM_API const char *vllm_last_error(void) { return tls_error != NULL ? tls_error : ""; }

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
    };
    if (status < 0 || (size_t)status >= sizeof names / sizeof names[0]) return "VLLM_ERR_UNKNOWN";
    return names[status];
}

VLLM_API void vllm_string_free(char *str) { free(str); }

char *glue_strndup(const char *data, size_t size) {
    char *copy = malloc(size + 1);
    if (copy != NULL) {
        memcpy(copy, data, size);
        copy[size] = '\0';
    }
    return copy;
}

/* Defaults of engine/config.py (EngineConfig). */
VLLM_API void vllm_engine_params_init(vllm_engine_params *params) {
    if (params == NULL) return;
    memset(params, 0, sizeof *params);
    params->struct_size = sizeof *params;
    params->max_num_seqs = 256;
    params->block_size = 16;
    params->enable_prefix_caching = 1;
    params->enable_chunked_prefill = 1;
}

/* Defaults of engine/sampling_params.py (vLLM's SamplingParams). */
VLLM_API void vllm_sampling_params_init(vllm_sampling_params *params) {
    if (params == NULL) return;
    memset(params, 0, sizeof *params);
    params->struct_size = sizeof *params;
    params->max_tokens = 16;
    params->temperature = 1.0f;
    params->top_p = 1.0f;
    params->skip_special_tokens = 1;
}

/* Copies a caller's params struct of struct_size bytes over defaults of size bytes. */
static vllm_status copy_params(void *dst, size_t size, const void *src, const char *function) {
    uint32_t given = *(const uint32_t *)src;
    if (given < size)
        return fail(VLLM_ERR_INVALID_ARGUMENT,
                    "%s: params->struct_size is %u, expected at least %zu (call the *_init function)",
                    function, (unsigned)given, size);
    memcpy(dst, src, size);
    return VLLM_OK;
}

/* ------------------------------------------------------------------------- */
/* Starting the Python runtime (once per process)                            */
/* ------------------------------------------------------------------------- */

static pthread_once_t runtime_once = PTHREAD_ONCE_INIT;
static vllm_status runtime_status = VLLM_ERR_RUNTIME_INIT;
static int runtime_ready;
static int owns_interpreter;
static char runtime_error[1024];
static char glue_start_error[1024];

int glue_owns_interpreter(void) { return owns_interpreter; }

void glue_set_start_error(const char *message) {
    snprintf(glue_start_error, sizeof glue_start_error, "%s", message);
}

PRINTF_LIKE(1, 2)
static vllm_status start_failed(const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(runtime_error, sizeof runtime_error, format, args);
    va_end(args);
    return VLLM_ERR_RUNTIME_INIT;
}

/* The python whose prefix (a virtual environment) holds the engine's packages. */
static const char *python_program(void) {
    const char *program = getenv("LIBVLLM_PYTHON");
    return program != NULL && program[0] != '\0' ? program : VLLM_BUILD_PYTHON;
}

/* With the GIL held and an exception set: "Type: message" into buf; clears it. */
static void take_python_error(char *buf, size_t size) {
    PyObject *type, *value, *traceback, *text;
    const char *message = NULL;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    text = value != NULL ? PyObject_Str(value) : NULL;
    if (text != NULL) message = PyUnicode_AsUTF8(text);
    snprintf(buf, size, "%s: %s", type != NULL ? ((PyTypeObject *)type)->tp_name : "error",
             message != NULL ? message : "(no message)");
    PyErr_Clear();
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
}

static vllm_status start_python(void) {
    const char *program = python_program();
    PyConfig config;
    PyStatus status;
    if (access(program, X_OK) != 0)
        return start_failed("cannot start Python: %s is not an executable file "
                            "(set LIBVLLM_PYTHON to the python of libvllm's environment)",
                            program);
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0;  /* the host owns signals */
    status = PyConfig_SetBytesString(&config, &config.program_name, program);
    if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status))
        return start_failed("cannot start Python from %s: %s", program,
                            status.err_msg != NULL ? status.err_msg : "unknown error");
    PyType_Modified(&PyCapsule_Type);  /* see adopt_python */
    PyEval_SaveThread();
    owns_interpreter = 1;
    return VLLM_OK;
}

/* The host process already runs Python (e.g. it loaded us with ctypes). */
static vllm_status adopt_python(void) {
    char wanted[16];
    const char *running = Py_GetVersion();
    PyGILState_STATE gil;
    snprintf(wanted, sizeof wanted, "%d.%d.", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    if (strncmp(running, wanted, strlen(wanted)) != 0)
        return start_failed("the running Python is %.*s but libvllm was built for Python %d.%d",
                            (int)strcspn(running, " "), running, PY_MAJOR_VERSION,
                            PY_MINOR_VERSION);
    /* cffi's start-up lock (Python < 3.12) spins until PyCapsule_Type.tp_version_tag
     * is 0; a host that used capsules (import torch) has set it. Reset it. */
    gil = PyGILState_Ensure();
    PyType_Modified(&PyCapsule_Type);
    PyGILState_Release(gil);
    return VLLM_OK;
}

/* Imports _cffi_backend ourselves first: if that fails, cffi would print to stderr
 * and carry on; here it becomes an error message. */
static vllm_status start_glue(void) {
    char message[768];
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *backend = PyImport_ImportModule("_cffi_backend");
    if (backend == NULL) take_python_error(message, sizeof message);
    Py_XDECREF(backend);
    PyGILState_Release(gil);
    if (backend == NULL)
        return start_failed("cannot start Python: importing cffi failed: %s", message);
    if (cffi_start_python() != 0)
        return start_failed("cannot start libvllm's Python side (cffi embedding start-up failed)");
    if (glue_start_error[0] != '\0') return start_failed("%s", glue_start_error);
    return VLLM_OK;
}

static void start_runtime(void) {
    vllm_status status = Py_IsInitialized() ? adopt_python() : start_python();
    if (status == VLLM_OK) status = start_glue();
    runtime_status = status;
    if (status == VLLM_OK) __atomic_store_n(&runtime_ready, 1, __ATOMIC_RELEASE);
}

static vllm_status ensure_runtime(void) {
    pthread_once(&runtime_once, start_runtime);
    if (runtime_status != VLLM_OK) set_error(runtime_error);
    return runtime_status;
}

static int runtime_started(void) { return __atomic_load_n(&runtime_ready, __ATOMIC_ACQUIRE); }

/* ------------------------------------------------------------------------- */
/* Shims                                                                      */
/* ------------------------------------------------------------------------- */

static uint64_t engine_key(const vllm_engine *engine) { return (uint64_t)(uintptr_t)engine; }

VLLM_API vllm_status vllm_init(void) {
    vllm_status status;
    clear_error();
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_init();
}

VLLM_API void vllm_shutdown(void) {
    clear_error();
    if (runtime_started()) (void)glue_shutdown();
}

VLLM_API vllm_status vllm_engine_create(const char *model_path, const vllm_engine_params *params,
                                        vllm_engine **out) {
    vllm_engine_params copy;
    uint64_t key = 0;
    vllm_status status;
    clear_error();
    if (out == NULL) return null_argument(__func__, "out");
    *out = NULL;
    if (model_path == NULL) return null_argument(__func__, "model_path");
    vllm_engine_params_init(&copy);
    if (params != NULL && (status = copy_params(&copy, sizeof copy, params, __func__)) != VLLM_OK)
        return status;
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    status = glue_engine_create(model_path, &copy, &key);
    if (status == VLLM_OK) *out = (vllm_engine *)(uintptr_t)key;
    return status;
}

VLLM_API void vllm_engine_free(vllm_engine *engine) {
    clear_error();
    if (engine != NULL && runtime_started()) (void)glue_engine_free(engine_key(engine));
}

VLLM_API vllm_status vllm_engine_model_info(vllm_engine *engine, vllm_model_info *out) {
    vllm_model_info info;
    uint32_t size;
    vllm_status status;
    clear_error();
    if (engine == NULL) return null_argument(__func__, "engine");
    if (out == NULL) return null_argument(__func__, "out");
    size = out->struct_size;
    if (size < sizeof info)
        return fail(VLLM_ERR_INVALID_ARGUMENT,
                    "%s: out->struct_size is %u, expected at least %zu", __func__,
                    (unsigned)size, sizeof info);
    memset(&info, 0, sizeof info);
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    if ((status = glue_engine_model_info(engine_key(engine), &info)) != VLLM_OK) return status;
    memcpy(out, &info, sizeof info);
    out->struct_size = size;
    return VLLM_OK;
}

VLLM_API vllm_status vllm_tokenize(vllm_engine *engine, const char *text,
                                   int32_t add_special_tokens, int32_t *tokens, size_t capacity,
                                   size_t *n_tokens) {
    vllm_status status;
    clear_error();
    if (n_tokens == NULL) return null_argument(__func__, "n_tokens");
    *n_tokens = 0;
    if (engine == NULL) return null_argument(__func__, "engine");
    if (text == NULL) return null_argument(__func__, "text");
    if (tokens == NULL && capacity > 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: tokens is NULL but capacity is %zu",
                    __func__, capacity);
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_tokenize(engine_key(engine), text, add_special_tokens, tokens, capacity,
                         n_tokens);
}

VLLM_API vllm_status vllm_detokenize(vllm_engine *engine, const int32_t *tokens, size_t n_tokens,
                                     int32_t skip_special_tokens, char *buf, size_t capacity,
                                     size_t *n_bytes) {
    vllm_status status;
    clear_error();
    if (n_bytes == NULL) return null_argument(__func__, "n_bytes");
    *n_bytes = 0;
    if (engine == NULL) return null_argument(__func__, "engine");
    if (tokens == NULL && n_tokens > 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: tokens is NULL but n_tokens is %zu",
                    __func__, n_tokens);
    if (buf == NULL && capacity > 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: buf is NULL but capacity is %zu", __func__,
                    capacity);
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_detokenize(engine_key(engine), tokens, n_tokens, skip_special_tokens, buf,
                           capacity, n_bytes);
}

VLLM_API vllm_status vllm_chat_template_apply(vllm_engine *engine, const char *messages_json,
                                              int32_t add_generation_prompt, char **out) {
    vllm_status status;
    clear_error();
    if (out == NULL) return null_argument(__func__, "out");
    *out = NULL;
    if (engine == NULL) return null_argument(__func__, "engine");
    if (messages_json == NULL) return null_argument(__func__, "messages_json");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_chat_template_apply(engine_key(engine), messages_json, add_generation_prompt, out);
}

/* Exactly one of a text prompt or a non-empty token array. */
static vllm_status check_prompt(const char *prompt, const int32_t *ids, size_t n_ids,
                                const char *function) {
    if (ids == NULL && n_ids > 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: prompt_token_ids is NULL but "
                    "n_prompt_token_ids is %zu", function, n_ids);
    if (prompt == NULL && n_ids == 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: give a prompt or prompt_token_ids",
                    function);
    if (prompt != NULL && n_ids > 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: give a prompt or prompt_token_ids, not both",
                    function);
    return VLLM_OK;
}

VLLM_API vllm_status vllm_request_add(vllm_engine *engine, const char *request_id,
                                      const char *prompt, const int32_t *prompt_token_ids,
                                      size_t n_prompt_token_ids,
                                      const vllm_sampling_params *params) {
    vllm_sampling_params copy;
    vllm_status status;
    clear_error();
    if (engine == NULL) return null_argument(__func__, "engine");
    if (request_id == NULL) return null_argument(__func__, "request_id");
    if ((status = check_prompt(prompt, prompt_token_ids, n_prompt_token_ids, __func__)) != VLLM_OK)
        return status;
    vllm_sampling_params_init(&copy);
    if (params != NULL && (status = copy_params(&copy, sizeof copy, params, __func__)) != VLLM_OK)
        return status;
    if (copy.stop_token_ids == NULL && copy.n_stop_token_ids > 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: params->stop_token_ids is NULL but "
                    "n_stop_token_ids is %zu", __func__, copy.n_stop_token_ids);
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_request_add(engine_key(engine), request_id, prompt, prompt_token_ids,
                            n_prompt_token_ids, &copy);
}

VLLM_API vllm_status vllm_request_abort(vllm_engine *engine, const char *request_id) {
    vllm_status status;
    clear_error();
    if (engine == NULL) return null_argument(__func__, "engine");
    if (request_id == NULL) return null_argument(__func__, "request_id");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_request_abort(engine_key(engine), request_id);
}

VLLM_API vllm_status vllm_engine_step(vllm_engine *engine, const vllm_request_output **outputs,
                                      size_t *n_outputs) {
    vllm_status status;
    clear_error();
    if (outputs == NULL) return null_argument(__func__, "outputs");
    *outputs = NULL;
    if (n_outputs == NULL) return null_argument(__func__, "n_outputs");
    *n_outputs = 0;
    if (engine == NULL) return null_argument(__func__, "engine");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_engine_step(engine_key(engine), outputs, n_outputs);
}

VLLM_API vllm_status vllm_engine_num_unfinished(vllm_engine *engine, size_t *n) {
    vllm_status status;
    clear_error();
    if (n == NULL) return null_argument(__func__, "n");
    *n = 0;
    if (engine == NULL) return null_argument(__func__, "engine");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_engine_num_unfinished(engine_key(engine), n);
}
