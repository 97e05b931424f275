/*
 * tests/c/no_python.c - the pure-C part of vllm.h works without the Python runtime,
 * and a runtime that cannot start is an error, not a crash (tests/test_capi_header.py).
 *
 * Run with LIBVLLM_PYTHON set to a path that does not exist. Prints what it saw;
 * exits 0 when every expectation held.
 */

#include <stdio.h>
#include <string.h>

#include "vllm.h"

static int failures;

static void expect(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok" : "FAIL", what);
    if (!ok) failures++;
}

int main(void) {
    vllm_engine_params params;
    vllm_sampling_params sp;
    vllm_engine *engine = NULL;
    vllm_status status;

    printf("version %s abi %u\n", vllm_version(), (unsigned)vllm_abi_version());
    expect(vllm_abi_version() == VLLM_ABI_VERSION, "abi version matches the header");
    expect(strcmp(vllm_status_string(VLLM_OK), "VLLM_OK") == 0, "status string");
    expect(vllm_last_error()[0] == '\0', "no error yet");
    vllm_engine_params_init(&params, sizeof params);
    vllm_sampling_params_init(&sp, sizeof sp);
    expect(params.struct_size == sizeof params && sp.struct_size == sizeof sp, "init");
    expect(params.served_model_name == NULL && params.progress_callback == NULL, "0.2 defaults");
    expect(strcmp(vllm_status_string(VLLM_ERR_INVALID_STATE), "VLLM_ERR_INVALID_STATE") == 0,
           "0.2 status strings");
    vllm_log_set(VLLM_LOG_INFO, NULL, NULL);
    expect(vllm_last_error()[0] == '\0', "vllm_log_set is pure C");

    status = vllm_init();
    printf("vllm_init: %s: %s\n", vllm_status_string(status), vllm_last_error());
    expect(status == VLLM_ERR_RUNTIME_INIT, "vllm_init fails with VLLM_ERR_RUNTIME_INIT");
    expect(strstr(vllm_last_error(), "LIBVLLM_PYTHON") != NULL, "the message names the fix");
    status = vllm_engine_create("model.gguf", NULL, &engine);
    expect(status == VLLM_ERR_RUNTIME_INIT && engine == NULL, "later calls fail the same way");
    vllm_request_free(NULL);
    vllm_openai_stream_free(NULL);
    expect(vllm_request_cancel(NULL) == VLLM_ERR_INVALID_ARGUMENT, "NULL request");
    vllm_shutdown();
    return failures ? 1 : 0;
}
