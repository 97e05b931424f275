/*
 * capi/loader.c - libvllm.so itself: a C library that links neither libpython nor any
 * path of the machine it was built on. On the first Python-backed call it finds a
 * Python (LIBVLLM_PYTHON, libvllm.cfg beside the library, the environment the library
 * is installed into), asks that python where its libpython is, loads it RTLD_GLOBAL,
 * then loads the runtime library libvllm-python.so.<major> from its own folder (the
 * cffi embedding module, capi/libvllm.c, which links no libpython either) and forwards
 * every call to it. A wheel may neither bundle nor link libpython (auditwheel's rule):
 * this is how one binary serves any environment of its Python minor version.
 *
 * capi/build.py pastes capi/pure.c, this file, then the generated forwarders (one per
 * Python-backed function of vllm.h) into one C file with VLLM_LIB_VERSION,
 * LIBVLLM_PY_VERSION ("3.11") and LIBVLLM_RUNTIME ("libvllm-python.so.1") defined.
 * The pure functions (capi/pure.c) answer here without loading anything.
 */

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* ------------------------------------------------------------------------- */
/* Paths                                                                      */
/* ------------------------------------------------------------------------- */

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

static int is_executable_file(const char *path) {
    struct stat st;
    return path[0] != '\0' && stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
           access(path, X_OK) == 0;
}

static int has_python_side(const char *dir) {
    char glue[PATH_MAX + 16];
    struct stat st;
    snprintf(glue, sizeof glue, "%s/libvllm/capi/glue.py", dir);
    return stat(glue, &st) == 0;
}

static int ends_with(const char *text, const char *suffix) {
    size_t n = strlen(text), k = strlen(suffix);
    return n >= k && strcmp(text + n - k, suffix) == 0;
}

static char *trim(char *text) {
    char *end;
    while (*text == ' ' || *text == '\t') text++;
    end = text + strlen(text);
    while (end > text && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
        *--end = '\0';
    return text;
}

/* ------------------------------------------------------------------------- */
/* What the loader found                                                      */
/* ------------------------------------------------------------------------- */

static char lib_dir[PATH_MAX];            /* this library's folder */
static char cfg_file[PATH_MAX + 16];      /* lib_dir/libvllm.cfg, "" when absent */
static char cfg_python[PATH_MAX];         /* its python =, resolved */
static char cfg_pythonpath[PATH_MAX];     /* its pythonpath =, resolved */
static char found_python[PATH_MAX];
static char found_pythonpath[PATH_MAX];
static char load_error[3072];
static void *runtime_handle;
static int runtime_loaded;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

PRINTF_LIKE(1, 2)
static int load_failed(const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(load_error, sizeof load_error, format, args);
    va_end(args);
    return 0;
}

/* libvllm.cfg beside the library, `key = value` lines (relative values are relative to
 * its folder): python = the interpreter of the environment that holds torch;
 * pythonpath = the folder that holds libvllm/ (capi/, engine/, kernels/). Both optional. */
static void read_cfg(void) {
    char line[PATH_MAX + 64];
    FILE *file;
    snprintf(cfg_file, sizeof cfg_file, "%s/libvllm.cfg", lib_dir);
    if ((file = fopen(cfg_file, "r")) == NULL) {
        cfg_file[0] = '\0';
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
            resolve_path(lib_dir, value, cfg_python, sizeof cfg_python);
        else if (strcmp(key, "pythonpath") == 0)
            resolve_path(lib_dir, value, cfg_pythonpath, sizeof cfg_pythonpath);
    }
    fclose(file);
}

/* The folder that holds libvllm/capi/glue.py: LIBVLLM_SOURCE_DIR (development), the cfg's
 * pythonpath, lib/libvllm/python (make install), .. (build/), ../../.. (the wheel's
 * libvllm/capi/lib); "" when none: the python environment's own sys.path must have it. */
static void find_pythonpath(void) {
    static const char *const relative[] = {"libvllm/python", "..", "../../.."};
    const char *env = getenv("LIBVLLM_SOURCE_DIR");
    if (env != NULL && env[0] != '\0') {
        snprintf(found_pythonpath, sizeof found_pythonpath, "%s", env);
        return;
    }
    if (cfg_pythonpath[0] != '\0' && has_python_side(cfg_pythonpath)) {
        snprintf(found_pythonpath, sizeof found_pythonpath, "%s", cfg_pythonpath);
        return;
    }
    for (size_t i = 0; i < sizeof relative / sizeof relative[0]; i++) {
        resolve_path(lib_dir, relative[i], found_pythonpath, sizeof found_pythonpath);
        if (has_python_side(found_pythonpath)) return;
    }
    found_pythonpath[0] = '\0';
}

/* LIBVLLM_PYTHON (only it, when set); else the cfg's python; else the environment the
 * library is installed into (PREFIX/bin beside PREFIX/lib; ENV/bin above the wheel's
 * ENV/lib/python3.X/site-packages/libvllm/capi/lib). 0 with load_error saying what was tried. */
static int find_python(void) {
    const char *name = "python" LIBVLLM_PY_VERSION;
    const char *env = getenv("LIBVLLM_PYTHON");
    char tried[2048] = "";
    /* PREFIX/lib -> PREFIX/bin; ENV/lib/python3.X/site-packages/libvllm/capi/lib -> ENV/bin */
    static const char *const installed[] = {"../bin", "../../../../../../bin"};
    char relative[64];
    size_t used = 0;
    if (env != NULL && env[0] != '\0') {
        if (is_executable_file(env)) {
            snprintf(found_python, sizeof found_python, "%s", env);
            return 1;
        }
        return load_failed("cannot start Python: LIBVLLM_PYTHON=%s is not an executable file "
                           "(set LIBVLLM_PYTHON to the python of an environment that has "
                           "torch and the libvllm package)", env);
    }
    if (cfg_python[0] != '\0') {
        if (is_executable_file(cfg_python)) {
            snprintf(found_python, sizeof found_python, "%s", cfg_python);
            return 1;
        }
        used += (size_t)snprintf(tried + used, sizeof tried - used, "%s (python of %s); ",
                                 cfg_python, cfg_file);
    }
    for (size_t i = 0; i < sizeof installed / sizeof installed[0]; i++) {
        if (i == 1 && !ends_with(lib_dir, "/lib/python" LIBVLLM_PY_VERSION "/site-packages/libvllm/capi/lib"))
            continue;
        snprintf(relative, sizeof relative, "%s/%s", installed[i], name);
        resolve_path(lib_dir, relative, found_python, sizeof found_python);
        if (is_executable_file(found_python)) return 1;
        if (used < sizeof tried)
            used += (size_t)snprintf(tried + used, sizeof tried - used, "%s; ", found_python);
    }
    found_python[0] = '\0';
    if (used >= 2 && used < sizeof tried) tried[used - 2] = '\0';  /* the last "; " */
    return load_failed("cannot start Python: LIBVLLM_PYTHON is not set and no python was "
                       "found (tried: %s) - set LIBVLLM_PYTHON to the python of an environment "
                       "that has torch and the libvllm package", tried);
}

/* Runs `python -I -S -c code`; its stdout (at most size - 1 bytes) into out. */
static int run_python(const char *python, const char *code, char *out, size_t size) {
    int pipe_fds[2], status = 0;
    size_t got = 0;
    ssize_t n;
    pid_t pid;
    posix_spawn_file_actions_t actions;
    char *const argv[] = {(char *)python, "-I", "-S", "-c", (char *)code, NULL};
    if (pipe(pipe_fds) != 0) return load_failed("cannot run %s: pipe: %s", python, strerror(errno));
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
    int spawned = posix_spawn(&pid, python, &actions, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(pipe_fds[1]);
    if (spawned != 0) {
        close(pipe_fds[0]);
        return load_failed("cannot run %s: %s", python, strerror(spawned));
    }
    while (got + 1 < size && ((n = read(pipe_fds[0], out + got, size - 1 - got)) > 0 ||
                              (n < 0 && errno == EINTR)))
        if (n > 0) got += (size_t)n;
    out[got] = '\0';
    close(pipe_fds[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return load_failed("cannot start Python: %s -c 'import sysconfig' failed (status %d)",
                           python, status);
    return 1;
}

/* Loads the libpython of found_python RTLD_GLOBAL (the runtime library's Python
 * symbols resolve against it). That python names the candidates, in order: its shared
 * library names (INSTSONAME, LDLIBRARY, libpython3.X.so.1.0, libpython3.X.so) in LIBDIR,
 * in sys.base_prefix/lib (an installation that moved since it was built), then the bare
 * names for the loader's search path (a python linked statically, its libpython
 * packaged apart). */
static int load_libpython(void) {
    static const char code[] =
        "import os, sys, sysconfig as s; v = s.get_config_var; lv = v('LDVERSION') or ''\n"
        "names = [n for n in (v('INSTSONAME'), v('LDLIBRARY'), 'libpython%s.so.1.0' % lv,\n"
        "         'libpython%s.so' % lv) if n and '.so' in n]\n"
        "dirs = [d for d in (v('LIBDIR'), os.path.join(sys.base_prefix, 'lib')) if d]\n"
        "print('%d.%d' % sys.version_info[:2])\n"
        "print('\\n'.join(dict.fromkeys([os.path.join(d, n) for n in names for d in dirs\n"
        "                                if os.path.isfile(os.path.join(d, n))] + names)))";
    char answer[8 * PATH_MAX], tried[2048] = "";
    char *version, *candidate, *save = NULL;
    size_t used = 0;
    if (!run_python(found_python, code, answer, sizeof answer)) return 0;
    version = strtok_r(answer, "\n", &save);
    if (version == NULL || strcmp(version, LIBVLLM_PY_VERSION) != 0)
        return load_failed("cannot start Python: %s is Python %s, libvllm was built for Python "
                           "%s (set LIBVLLM_PYTHON to a python %s of an environment that has "
                           "torch and the libvllm package)", found_python,
                           version != NULL ? version : "(unknown)", LIBVLLM_PY_VERSION,
                           LIBVLLM_PY_VERSION);
    while ((candidate = strtok_r(NULL, "\n", &save)) != NULL) {
        if (dlopen(candidate, RTLD_NOW | RTLD_GLOBAL) != NULL) return 1;
        if (used < sizeof tried)
            used += (size_t)snprintf(tried + used, sizeof tried - used, "%s%s",
                                     used > 0 ? ", " : "", candidate);
    }
    return load_failed("cannot start Python: no shared libpython of %s loads (tried: %s; a "
                       "python built without --enable-shared and no libpython%s.so installed "
                       "cannot host libvllm)", found_python, tried[0] ? tried : "none named",
                       LIBVLLM_PY_VERSION);
}

/* ------------------------------------------------------------------------- */
/* Loading the runtime library                                                */
/* ------------------------------------------------------------------------- */

static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;
static int log_was_set;
static int32_t log_min_level;
static vllm_log_callback log_callback;
static void *log_user_data;

static int bind_forwarders(void *handle);  /* generated: 0 and load_error on a missing one */

static int load_runtime_steps(void) {
    char runtime[PATH_MAX + 64];
    void (*configure)(const char *, const char *);
    void (*log_set)(int32_t, vllm_log_callback, void *);
    /* a Python host (ctypes) already has libpython's symbols: none is loaded then */
    int host_python = dlsym(RTLD_DEFAULT, "Py_IsInitialized") != NULL;
    if (!folder_of((const void *)&vllm_abi_version, lib_dir, sizeof lib_dir))
        return load_failed("cannot find the file libvllm was loaded from (dladdr failed)");
    read_cfg();
    find_pythonpath();
    if (!host_python && (!find_python() || !load_libpython())) return 0;
    if (host_python && !find_python()) found_python[0] = '\0';
    snprintf(runtime, sizeof runtime, "%s/%s", lib_dir, LIBVLLM_RUNTIME);
    if ((runtime_handle = dlopen(runtime, RTLD_NOW | RTLD_LOCAL)) == NULL)
        return load_failed("cannot load libvllm's runtime library %s: %s", runtime, dlerror());
    *(void **)&configure = dlsym(runtime_handle, "libvllm_runtime_configure");
    *(void **)&log_set = dlsym(runtime_handle, "vllm_log_set");
    if (configure == NULL || log_set == NULL || !bind_forwarders(runtime_handle))
        return load_failed("%s is not libvllm %s's runtime library (a symbol is missing)",
                           runtime, VLLM_LIB_VERSION);
    configure(found_python, found_pythonpath);
    pthread_mutex_lock(&log_mutex);
    if (log_was_set) log_set(log_min_level, log_callback, log_user_data);
    __atomic_store_n(&runtime_loaded, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&log_mutex);
    return 1;
}

static void load_runtime(void) { (void)load_runtime_steps(); }

/* 1 once the runtime library is loaded (loading it on the first call). */
static int runtime_ready(void) {
    pthread_once(&load_once, load_runtime);
    return __atomic_load_n(&runtime_loaded, __ATOMIC_ACQUIRE);
}

static int runtime_was_loaded(void) { return __atomic_load_n(&runtime_loaded, __ATOMIC_ACQUIRE); }

/* A call the runtime library cannot answer: a NULL handle (first argument) is the
 * caller's error, as the runtime library's own checks would say; else the load error. */
static vllm_status not_loaded(const char *function, int first_argument_null) {
    if (first_argument_null)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: its first argument is NULL", function);
    return fail(VLLM_ERR_RUNTIME_INIT, "%s", load_error);
}

static const char *(*runtime_last_error)(void);

VLLM_API const char *vllm_last_error(void) {
    return runtime_was_loaded() ? runtime_last_error() : own_last_error();
}

/* Pure C until the runtime library is loaded: kept and handed to it when it is. */
VLLM_API void vllm_log_set(int32_t min_level, vllm_log_callback callback, void *user_data) {
    static void (*log_set)(int32_t, vllm_log_callback, void *);
    pthread_mutex_lock(&log_mutex);
    log_was_set = 1;
    log_min_level = min_level;
    log_callback = callback;
    log_user_data = user_data;
    int loaded = runtime_was_loaded();
    pthread_mutex_unlock(&log_mutex);
    clear_error();
    if (!loaded) return;
    if (log_set == NULL) *(void **)&log_set = dlsym(runtime_handle, "vllm_log_set");
    log_set(min_level, callback, user_data);
}
