/*
 * capi/libvllm.c - the C side of the runtime library (libvllm-python.so): every
 * function of include/vllm.h, built as a cffi embedding module that links no libpython.
 * The loader libvllm.so (capi/loader.c) finds a Python, loads its libpython and this
 * library, and forwards to it.
 *
 * Two kinds of exports:
 *   - pure C (capi/pure.c: version, status strings, last error, string free, *_init):
 *     they never start the Python runtime;
 *   - shims: check their arguments in C (NULL pointers, struct_size, capacity vs
 *     buffer), start the runtime once, then call the Python side through the
 *     glue_* functions of capi/glue.h.
 *
 * The C files are not compiled on their own: capi/build.py pastes capi/pure.c,
 * capi/libvllm.c (this file: callbacks, starting the runtime), capi/shims.c (the
 * engine, tokenizer, chat template and caller-driven request shims) and
 * capi/stream_shims.c (background loop, streaming, OpenAI layer), in this order, into
 * the C file that cffi generates (after Python.h and cffi's embedding support, which
 * provides cffi_start_python()), with VLLM_LIB_VERSION defined.
 *
 * No path is compiled in: the loader passes the python to start and the folder of the
 * Python side (libvllm_runtime_configure).
 */

#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include "glue.h"

void glue_set_error(const char *message) { set_error(message); }

VLLM_API const char *vllm_last_error(void) { return own_last_error(); }

char *glue_strndup(const char *data, size_t size) {
    char *copy = malloc(size + 1);
    if (copy != NULL) {
        memcpy(copy, data, size);
        copy[size] = '\0';
    }
    return copy;
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
/* Where the Python side is: told by the loader                               */
/* ------------------------------------------------------------------------- */

static char runtime_python[PATH_MAX];     /* "" when the host already runs Python */
static char runtime_pythonpath[PATH_MAX]; /* "" when the environment's sys.path has it */

const char *glue_python_path(void) { return runtime_pythonpath; }

/* Called by the loader (capi/loader.c) once, before any other function. */
__attribute__((visibility("default"))) void libvllm_runtime_configure(const char *python,
                                                                     const char *pythonpath) {
    snprintf(runtime_python, sizeof runtime_python, "%s", python != NULL ? python : "");
    snprintf(runtime_pythonpath, sizeof runtime_pythonpath, "%s",
             pythonpath != NULL ? pythonpath : "");
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
    if (program[0] == '\0')
        return start_failed("cannot start Python: no python was located (set LIBVLLM_PYTHON)");
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
