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
 * The C files are not compiled on their own: capi/build.py pastes capi/libvllm.c
 * (this file: last error, pure-C functions, callbacks, starting the runtime),
 * capi/shims.c (the engine, tokenizer, chat template and caller-driven request
 * shims) and capi/stream_shims.c (background loop, streaming, OpenAI layer), in this
 * order, into the C file that cffi generates (after Python.h and cffi's embedding
 * support, which provides cffi_start_python()), with VLLM_LIB_VERSION defined.
 *
 * No path is compiled in: the library finds its Python side from its own location
 * (dladdr) and the libvllm.cfg file beside it (see locate_runtime).
 */

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
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

char *glue_strndup(const char *data, size_t size) {
    char *copy = malloc(size + 1);
    if (copy != NULL) {
        memcpy(copy, data, size);
        copy[size] = '\0';
    }
    return copy;
}

/* Writes the first min(size, full) bytes of defaults over dst, struct_size being that
 * count: a caller built against an older header passes its smaller sizeof. */
static void write_defaults(void *dst, size_t size, void *defaults, size_t full) {
    size_t n = size < full ? size : full;
    if (dst == NULL || n < sizeof(uint32_t)) return;
    *(uint32_t *)defaults = (uint32_t)n;
    memcpy(dst, defaults, n);
}

/* Defaults of engine/config.py (EngineConfig). */
VLLM_API void vllm_engine_params_init(vllm_engine_params *params, size_t size) {
    vllm_engine_params d;
    memset(&d, 0, sizeof d);
    d.block_size = 16;
    d.enable_prefix_caching = 1;
    d.enable_chunked_prefill = 1;
    d.gpu_memory_utilization = 0.9f;
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

/* The sizes of the structs as their first ABI version defined them: a caller built
 * against that header passes this struct_size. */
#define ENGINE_PARAMS_V0_1_SIZE offsetof(vllm_engine_params, served_model_name)
#define SAMPLING_PARAMS_V0_1_SIZE offsetof(vllm_sampling_params, presence_penalty)
#define MODEL_INFO_V0_1_SIZE offsetof(vllm_model_info, n_params)
#define METRICS_V0_2_SIZE offsetof(vllm_metrics, request_success_repetition)

/* Copies the first min(struct_size, size) bytes of a caller's params struct over
 * defaults of size bytes; struct_size below min_size (no header had it) is an error. */
static vllm_status copy_params(void *dst, size_t size, size_t min_size, const void *src,
                               const char *function) {
    uint32_t given = *(const uint32_t *)src;
    if (given < min_size)
        return fail(VLLM_ERR_INVALID_ARGUMENT,
                    "%s: params->struct_size is %u, expected at least %zu (call the *_init function)",
                    function, (unsigned)given, min_size);
    memcpy(dst, src, given < size ? given : size);
    *(uint32_t *)dst = (uint32_t)size; /* every params struct starts with struct_size */
    return VLLM_OK;
}

/* Checks an out struct's struct_size; the caller then copies min(struct_size, size). */
static vllm_status check_out_size(uint32_t given, size_t min_size, const char *function) {
    if (given < min_size)
        return fail(VLLM_ERR_INVALID_ARGUMENT,
                    "%s: out->struct_size is %u, expected at least %zu", function,
                    (unsigned)given, min_size);
    return VLLM_OK;
}

/* ------------------------------------------------------------------------- */
/* Callbacks (log, load progress, request events)                             */
/* ------------------------------------------------------------------------- */

static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;
static vllm_log_callback log_callback;
static void *log_user_data;
static int32_t log_min_level = VLLM_LOG_WARNING;

int32_t glue_log_level(void) {
    int32_t level;
    pthread_mutex_lock(&log_mutex);
    level = log_callback != NULL ? log_min_level : -1;
    pthread_mutex_unlock(&log_mutex);
    return level;
}

void glue_log(int32_t level, const char *message) {
    vllm_log_callback callback;
    void *user_data;
    pthread_mutex_lock(&log_mutex);
    callback = level >= log_min_level ? log_callback : NULL;
    user_data = log_user_data;
    pthread_mutex_unlock(&log_mutex);
    if (callback != NULL) callback(level, message, user_data);
}

void glue_emit_event(vllm_event_callback callback, const vllm_event *event, void *user_data) {
    callback(event, user_data);
}

int32_t glue_emit_progress(vllm_progress_callback callback, float progress, void *user_data) {
    return callback(progress, user_data);
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

/* ------------------------------------------------------------------------- */
/* Where the Python side is: relative to this library file                    */
/* ------------------------------------------------------------------------- */

/* libvllm.cfg beside the library file (symlinks resolved), `key = value` lines:
 *   python     = the interpreter to start: the python of the environment whose
 *                site-packages hold torch (a virtual environment's bin/python);
 *   pythonpath = the folder that holds capi/, engine/ and kernels/.
 * Relative values are relative to the file's folder. capi/build.py writes one into
 * build/, capi/install.py into PREFIX/lib and into the wheel's capi/lib/. Without the
 * file: pythonpath "..", python the one whose libpython this library links.
 * Environment overrides: LIBVLLM_PYTHON, LIBVLLM_SOURCE_DIR. */
static char runtime_python[PATH_MAX];
static char runtime_pythonpath[PATH_MAX];
static char runtime_cfg[PATH_MAX + 16];

const char *glue_python_path(void) { return runtime_pythonpath; }

/* Lexically normalizes an absolute path in place ("." and ".." parts, double slashes):
 * no symlink is resolved (a virtual environment's python must keep its own path). */
static void normalize_path(char *path) {
    char *parts[PATH_MAX / 2];
    size_t n = 0;
    char copy[PATH_MAX];
    char *save = NULL;
    if (strlen(path) >= sizeof copy) return;
    strcpy(copy, path);
    for (char *part = strtok_r(copy, "/", &save); part != NULL; part = strtok_r(NULL, "/", &save)) {
        if (strcmp(part, ".") == 0) continue;
        if (strcmp(part, "..") == 0) {
            if (n > 0) n--;
            continue;
        }
        parts[n++] = part;
    }
    size_t len = 0;
    path[0] = '\0';
    for (size_t i = 0; i < n; i++) len += (size_t)sprintf(path + len, "/%s", parts[i]);
    if (n == 0) strcpy(path, "/");
}

/* value if absolute, else dir/value; normalized into out ("" when too long). */
static void resolve_path(const char *dir, const char *value, char *out, size_t size) {
    int n = value[0] == '/' ? snprintf(out, size, "%s", value)
                            : snprintf(out, size, "%s/%s", dir, value);
    if (n < 0 || (size_t)n >= size) out[0] = '\0';
    else normalize_path(out);
}

/* The folder of the file that holds `symbol` (symlinks resolved); 0 on failure. */
static int folder_of(const void *symbol, char *out, size_t size) {
    Dl_info info;
    char real[PATH_MAX];
    char *slash;
    if (dladdr(symbol, &info) == 0 || info.dli_fname == NULL ||
        realpath(info.dli_fname, real) == NULL)
        return 0;
    slash = strrchr(real, '/');
    if (slash == NULL) return 0;
    *slash = '\0';
    snprintf(out, size, "%s", real[0] != '\0' ? real : "/");
    return 1;
}

static char *trim(char *text) {
    char *end;
    while (*text == ' ' || *text == '\t') text++;
    end = text + strlen(text);
    while (end > text && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
        *--end = '\0';
    return text;
}

/* Reads python / pythonpath of dir/libvllm.cfg (absent: nothing set). */
static void read_runtime_cfg(const char *dir) {
    char line[PATH_MAX + 64];
    FILE *file;
    snprintf(runtime_cfg, sizeof runtime_cfg, "%s/libvllm.cfg", dir);
    if ((file = fopen(runtime_cfg, "r")) == NULL) {
        runtime_cfg[0] = '\0';
        return;
    }
    while (fgets(line, sizeof line, file) != NULL) {
        char *eq = strchr(line, '='), *key, *value;
        if (line[0] == '#' || eq == NULL) continue;
        *eq = '\0';
        key = trim(line);
        value = trim(eq + 1);
        if (value[0] == '\0') continue;
        if (strcmp(key, "python") == 0)
            resolve_path(dir, value, runtime_python, sizeof runtime_python);
        else if (strcmp(key, "pythonpath") == 0)
            resolve_path(dir, value, runtime_pythonpath, sizeof runtime_pythonpath);
    }
    fclose(file);
}

/* Fills runtime_python and runtime_pythonpath (see libvllm.cfg above). */
static vllm_status locate_runtime(void) {
    char dir[PATH_MAX];
    const char *env;
    if (!folder_of((const void *)&vllm_abi_version, dir, sizeof dir))
        return start_failed("cannot find the file libvllm was loaded from (dladdr failed)");
    read_runtime_cfg(dir);
    if ((env = getenv("LIBVLLM_SOURCE_DIR")) != NULL && env[0] != '\0')
        snprintf(runtime_pythonpath, sizeof runtime_pythonpath, "%s", env);
    else if (runtime_pythonpath[0] == '\0')
        resolve_path(dir, "..", runtime_pythonpath, sizeof runtime_pythonpath);
    if ((env = getenv("LIBVLLM_PYTHON")) != NULL && env[0] != '\0') {
        snprintf(runtime_python, sizeof runtime_python, "%s", env);
    } else if (runtime_python[0] == '\0') {  /* the Python installation we link */
        char libpython[PATH_MAX];
        char name[32];
        snprintf(name, sizeof name, "../bin/python%d.%d", PY_MAJOR_VERSION, PY_MINOR_VERSION);
        if (folder_of((const void *)&Py_InitializeFromConfig, libpython, sizeof libpython))
            resolve_path(libpython, name, runtime_python, sizeof runtime_python);
    }
    return VLLM_OK;
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

/* The host's SIGINT disposition before Python started: restored after `_signal` is
 * imported, which installs Python's KeyboardInterrupt handler over SIG_DFL even with
 * install_signal_handlers = 0. The host owns its signals. */
static vllm_status start_signal_module(const struct sigaction *host_sigint) {
    char message[512];
    PyObject *module = PyImport_ImportModule("_signal");
    if (module == NULL) {
        take_python_error(message, sizeof message);
        return start_failed("cannot start Python: importing _signal failed: %s", message);
    }
    Py_DECREF(module);
    sigaction(SIGINT, host_sigint, NULL);
    return VLLM_OK;
}

static vllm_status start_python(void) {
    const char *program = runtime_python;
    struct sigaction host_sigint;
    PyConfig config;
    PyStatus status;
    vllm_status result;
    if (access(program, X_OK) != 0)
        return start_failed("cannot start Python: %s%s%s is not an executable file (set "
                            "python in libvllm.cfg, or LIBVLLM_PYTHON, to the python of "
                            "libvllm's environment)", program,
                            runtime_cfg[0] != '\0' ? ", from " : "", runtime_cfg);
    sigaction(SIGINT, NULL, &host_sigint);
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0;  /* the host owns signals (see start_signal_module) */
    status = PyConfig_SetBytesString(&config, &config.program_name, program);
    if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status))
        return start_failed("cannot start Python from %s: %s", program,
                            status.err_msg != NULL ? status.err_msg : "unknown error");
    result = start_signal_module(&host_sigint);
    PyType_Modified(&PyCapsule_Type);  /* see adopt_python */
    PyEval_SaveThread();
    owns_interpreter = 1;
    return result;
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
    vllm_status status = locate_runtime();
    if (status == VLLM_OK) status = Py_IsInitialized() ? adopt_python() : start_python();
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

/* Pure C, but it tells a running runtime at once. */
VLLM_API void vllm_log_set(int32_t min_level, vllm_log_callback callback, void *user_data) {
    clear_error();
    pthread_mutex_lock(&log_mutex);
    log_callback = callback;
    log_user_data = user_data;
    log_min_level = min_level;
    pthread_mutex_unlock(&log_mutex);
    if (runtime_started()) (void)glue_log_configure();  /* else the start-up reads it */
}
