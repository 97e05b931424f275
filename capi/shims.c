/*
 * capi/shims.c - the shims of the engine, tokenizer, chat template and caller-driven
 * request functions of include/vllm.h: check the arguments in C (NULL pointers,
 * struct_size, capacity vs buffer), start the runtime once, call the glue_* function.
 *
 * Pasted after capi/libvllm.c by capi/build.py (one translation unit): it uses the
 * static helpers defined there.
 */

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
    vllm_engine_params_init(&copy, sizeof copy);
    if (params != NULL && (status = copy_params(&copy, sizeof copy, ENGINE_PARAMS_V0_1_SIZE,
                                                params, __func__)) != VLLM_OK)
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
    if ((status = check_out_size(size, MODEL_INFO_V0_1_SIZE, __func__)) != VLLM_OK) return status;
    memset(&info, 0, sizeof info);
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    if ((status = glue_engine_model_info(engine_key(engine), &info)) != VLLM_OK) return status;
    memcpy(out, &info, size < sizeof info ? size : sizeof info);
    out->struct_size = size;
    return VLLM_OK;
}

VLLM_API vllm_status vllm_model_meta_count(vllm_engine *engine, size_t *n) {
    vllm_status status;
    clear_error();
    if (n == NULL) return null_argument(__func__, "n");
    *n = 0;
    if (engine == NULL) return null_argument(__func__, "engine");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_model_meta_count(engine_key(engine), n);
}

/* The checks of a two-call-sized text out-parameter (buf, capacity, *n_bytes). */
static vllm_status check_text_out(char *buf, size_t capacity, size_t *n_bytes,
                                  const char *function) {
    if (n_bytes == NULL) return null_argument(function, "n_bytes");
    *n_bytes = 0;
    if (buf == NULL && capacity > 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: buf is NULL but capacity is %zu", function,
                    capacity);
    return VLLM_OK;
}

VLLM_API vllm_status vllm_model_meta_key(vllm_engine *engine, size_t index, char *buf,
                                         size_t capacity, size_t *n_bytes) {
    vllm_status status;
    clear_error();
    if ((status = check_text_out(buf, capacity, n_bytes, __func__)) != VLLM_OK) return status;
    if (engine == NULL) return null_argument(__func__, "engine");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_model_meta_key(engine_key(engine), index, buf, capacity, n_bytes);
}

VLLM_API vllm_status vllm_model_meta_value(vllm_engine *engine, const char *key, char *buf,
                                           size_t capacity, size_t *n_bytes) {
    vllm_status status;
    clear_error();
    if ((status = check_text_out(buf, capacity, n_bytes, __func__)) != VLLM_OK) return status;
    if (engine == NULL) return null_argument(__func__, "engine");
    if (key == NULL) return null_argument(__func__, "key");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_model_meta_value(engine_key(engine), key, buf, capacity, n_bytes);
}

VLLM_API vllm_status vllm_tokenize(vllm_engine *engine, const char *text, size_t text_len,
                                   int32_t add_special, int32_t parse_special, int32_t *tokens,
                                   size_t capacity, size_t *n_tokens) {
    vllm_status status;
    clear_error();
    if (n_tokens == NULL) return null_argument(__func__, "n_tokens");
    *n_tokens = 0;
    if (engine == NULL) return null_argument(__func__, "engine");
    if (text == NULL && text_len > 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: text is NULL but text_len is %zu", __func__,
                    text_len);
    if (tokens == NULL && capacity > 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: tokens is NULL but capacity is %zu",
                    __func__, capacity);
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_tokenize(engine_key(engine), text, text_len, add_special, parse_special, tokens,
                         capacity, n_tokens);
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

/* The caller's sampling params (NULL: defaults) into *copy, checked. */
static vllm_status copy_sampling_params(vllm_sampling_params *copy,
                                        const vllm_sampling_params *params, const char *function) {
    vllm_status status;
    vllm_sampling_params_init(copy, sizeof *copy);
    if (params != NULL && (status = copy_params(copy, sizeof *copy, SAMPLING_PARAMS_V0_1_SIZE,
                                                params, function)) != VLLM_OK)
        return status;
    if (copy->stop_token_ids == NULL && copy->n_stop_token_ids > 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: params->stop_token_ids is NULL but "
                    "n_stop_token_ids is %zu", function, copy->n_stop_token_ids);
    if ((copy->stop == NULL && copy->n_stop > 0) ||
        (copy->bad_words == NULL && copy->n_bad_words > 0) ||
        ((copy->logit_bias_token_ids == NULL || copy->logit_bias_values == NULL) &&
         copy->n_logit_bias > 0) ||
        (copy->allowed_token_ids == NULL && copy->n_allowed_token_ids > 0) ||
        (copy->choice == NULL && copy->n_choice > 0) ||
        (copy->logprob_token_ids == NULL && copy->n_logprob_token_ids > 0))
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: a params array pointer is NULL but its "
                    "count is not 0", function);
    for (size_t i = 0; i < copy->n_stop; i++)
        if (copy->stop[i] == NULL)
            return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: params->stop[%zu] is NULL", function, i);
    for (size_t i = 0; i < copy->n_bad_words; i++)
        if (copy->bad_words[i] == NULL)
            return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: params->bad_words[%zu] is NULL",
                        function, i);
    for (size_t i = 0; i < copy->n_choice; i++)
        if (copy->choice[i] == NULL)
            return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: params->choice[%zu] is NULL", function,
                        i);
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
    if ((status = copy_sampling_params(&copy, params, __func__)) != VLLM_OK) return status;
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

VLLM_API vllm_status vllm_token_to_piece(vllm_engine *engine, int32_t token, int32_t special,
                                         char *buf, size_t capacity, size_t *n_bytes) {
    vllm_status status;
    clear_error();
    if (n_bytes == NULL) return null_argument(__func__, "n_bytes");
    *n_bytes = 0;
    if (engine == NULL) return null_argument(__func__, "engine");
    if (buf == NULL && capacity > 0)
        return fail(VLLM_ERR_INVALID_ARGUMENT, "%s: buf is NULL but capacity is %zu", __func__,
                    capacity);
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_token_to_piece(engine_key(engine), token, special, buf, capacity, n_bytes);
}

VLLM_API vllm_status vllm_chat_template_render(vllm_engine *engine, const char *messages_json,
                                               const char *tools_json,
                                               int32_t add_generation_prompt, char **out) {
    vllm_status status;
    clear_error();
    if (out == NULL) return null_argument(__func__, "out");
    *out = NULL;
    if (engine == NULL) return null_argument(__func__, "engine");
    if (messages_json == NULL) return null_argument(__func__, "messages_json");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_chat_template_render(engine_key(engine), messages_json, tools_json,
                                     add_generation_prompt, out);
}

VLLM_API vllm_status vllm_engine_metrics(vllm_engine *engine, vllm_metrics *out) {
    vllm_metrics metrics;
    uint32_t size;
    vllm_status status;
    clear_error();
    if (engine == NULL) return null_argument(__func__, "engine");
    if (out == NULL) return null_argument(__func__, "out");
    size = out->struct_size;
    if ((status = check_out_size(size, METRICS_V0_2_SIZE, __func__)) != VLLM_OK) return status;
    memset(&metrics, 0, sizeof metrics);
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    if ((status = glue_engine_metrics(engine_key(engine), &metrics)) != VLLM_OK) return status;
    memcpy(out, &metrics, size < sizeof metrics ? size : sizeof metrics);
    out->struct_size = size;
    return VLLM_OK;
}

VLLM_API vllm_status vllm_engine_check_health(vllm_engine *engine) {
    vllm_status status;
    clear_error();
    if (engine == NULL) return null_argument(__func__, "engine");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_engine_check_health(engine_key(engine));
}

VLLM_API vllm_status vllm_embed(vllm_engine *engine, const char *const *texts,
                                const size_t *text_lens, const int32_t *const *token_ids,
                                const size_t *n_token_ids, size_t n_inputs,
                                int32_t dimensions, float *out, size_t capacity,
                                size_t *n_floats, size_t *dim) {
    vllm_status status;
    clear_error();
    if (engine == NULL) return null_argument(__func__, "engine");
    if (n_floats == NULL) return null_argument(__func__, "n_floats");
    if (dim == NULL) return null_argument(__func__, "dim");
    *n_floats = 0;
    *dim = 0;
    if (out == NULL && capacity > 0) return null_argument(__func__, "out");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_embed(engine_key(engine), texts, text_lens, token_ids, n_token_ids, n_inputs,
                      dimensions, out, capacity, n_floats, dim);
}

VLLM_API vllm_status vllm_engine_reset_prefix_cache(vllm_engine *engine) {
    vllm_status status;
    clear_error();
    if (engine == NULL) return null_argument(__func__, "engine");
    if ((status = ensure_runtime()) != VLLM_OK) return status;
    return glue_engine_reset_prefix_cache(engine_key(engine));
}
