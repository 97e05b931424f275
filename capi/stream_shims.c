/*
 * capi/stream_shims.c - the shims of the background loop, request streaming and the
 * OpenAI layer of include/vllm.h (since ABI 0.2). Request and OpenAI stream handles
 * are registry keys of the Python side, like engines.
 *
 * Pasted after capi/shims.c by capi/build.py (one translation unit).
 */

static uint64_t handle_key(const void *handle) { return (uint64_t)(uintptr_t)handle; }

VLLM_API vllm_status vllm_engine_start_loop(vllm_engine *engine) {
    vllm_status status;
    clear_error();
    if (engine == NULL) return null_argument(__func__, "engine");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_engine_start_loop(engine_key(engine));
}

VLLM_API vllm_status vllm_request_submit(vllm_engine *engine, const char *request_id,
                                         const char *prompt, const int32_t *prompt_token_ids,
                                         size_t n_prompt_token_ids,
                                         const vllm_sampling_params *params,
                                         vllm_event_callback callback, void *user_data,
                                         vllm_request **out) {
    vllm_sampling_params copy;
    uint64_t key = 0;
    vllm_status status;
    clear_error();
    if (out != NULL) *out = NULL;
    if (engine == NULL) return null_argument(__func__, "engine");
    if (request_id == NULL) return null_argument(__func__, "request_id");
    if (out == NULL && callback == NULL)
        return fail(VLLM_ERR_INVALID_ARGUMENT,
                    "%s: out is NULL without a callback: the events could not be read", __func__);
    if ((status = check_prompt(prompt, prompt_token_ids, n_prompt_token_ids, __func__)) != VLLM_OK)
        return status;
    if ((status = copy_sampling_params(&copy, params, __func__)) != VLLM_OK) return status;
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    status = glue_request_submit(engine_key(engine), request_id, prompt, prompt_token_ids,
                                 n_prompt_token_ids, &copy, callback, user_data,
                                 out != NULL ? &key : NULL);
    if (status == VLLM_OK && out != NULL) *out = (vllm_request *)(uintptr_t)key;
    return status;
}

VLLM_API vllm_status vllm_request_next(vllm_request *request, int32_t timeout_ms,
                                       const vllm_event **event) {
    vllm_status status;
    clear_error();
    if (event == NULL) return null_argument(__func__, "event");
    *event = NULL;
    if (request == NULL) return null_argument(__func__, "request");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_request_next(handle_key(request), timeout_ms, event);
}

VLLM_API vllm_status vllm_request_cancel(vllm_request *request) {
    vllm_status status;
    clear_error();
    if (request == NULL) return null_argument(__func__, "request");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_request_cancel(handle_key(request));
}

VLLM_API void vllm_request_free(vllm_request *request) {
    clear_error();
    if (request != NULL && runtime_started()) (void)glue_request_free(handle_key(request));
}

VLLM_API vllm_status vllm_openai_request(vllm_engine *engine, const char *method,
                                         const char *endpoint, const char *body,
                                         int32_t *http_status, char **response_json,
                                         vllm_openai_stream **stream) {
    return vllm_openai_request_len(engine, method, endpoint, body,
                                   body != NULL ? strlen(body) : 0, VLLM_OPENAI_DEFAULT,
                                   http_status, response_json, stream);
}

VLLM_API vllm_status vllm_openai_request_len(vllm_engine *engine, const char *method,
                                             const char *endpoint, const char *body,
                                             size_t body_size, uint32_t flags,
                                             int32_t *http_status, char **response_json,
                                             vllm_openai_stream **stream) {
    uint64_t key = 0;
    vllm_status status;
    clear_error();
    if (http_status != NULL) *http_status = 0;
    if (response_json != NULL) *response_json = NULL;
    if (stream != NULL) *stream = NULL;
    if (engine == NULL) return null_argument(__func__, "engine");
    if (method == NULL) return null_argument(__func__, "method");
    if (endpoint == NULL) return null_argument(__func__, "endpoint");
    if (http_status == NULL) return null_argument(__func__, "http_status");
    if (response_json == NULL) return null_argument(__func__, "response_json");
    if (stream == NULL) return null_argument(__func__, "stream");
    if (body == NULL && body_size != 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: body is NULL but body_size is %zu",
                    __func__, body_size);
    if ((flags & ~(uint32_t)VLLM_OPENAI_DEFER_RESPONSE) != 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: unknown flags %#x", __func__,
                    (unsigned)flags);
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    status = glue_openai_request(engine_key(engine), method, endpoint, body != NULL ? body : "",
                                 body_size, flags, http_status, response_json, &key);
    if (status == VLLM_OK && key != 0) *stream = (vllm_openai_stream *)(uintptr_t)key;
    return status;
}

VLLM_API vllm_status vllm_openai_stream_next(vllm_openai_stream *stream, int32_t timeout_ms,
                                             char **chunk_json) {
    vllm_status status;
    clear_error();
    if (chunk_json == NULL) return null_argument(__func__, "chunk_json");
    *chunk_json = NULL;
    if (stream == NULL) return null_argument(__func__, "stream");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_openai_stream_next(handle_key(stream), timeout_ms, chunk_json);
}

VLLM_API vllm_status vllm_openai_stream_cancel(vllm_openai_stream *stream) {
    vllm_status status;
    clear_error();
    if (stream == NULL) return null_argument(__func__, "stream");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_openai_stream_cancel(handle_key(stream));
}

VLLM_API void vllm_openai_stream_free(vllm_openai_stream *stream) {
    clear_error();
    if (stream != NULL && runtime_started()) (void)glue_openai_stream_free(handle_key(stream));
}
