/*
 * capi/glue.h - the boundary between the C shims (capi/libvllm.c) and Python.
 *
 * GLUE_PYTHON: functions implemented in Python by capi/glue.py (@ffi.def_extern).
 *   capi/build.py declares them to cffi as `extern "Python+C"`; cffi generates their
 *   C bodies, which enter the interpreter. The shims call them only after they have
 *   checked their arguments and started the runtime. Each returns a vllm_status and
 *   sets the thread's last error on failure.
 * GLUE_C: helpers written in C (capi/libvllm.c) that the Python side calls.
 *
 * Handles (engines, requests, OpenAI streams) cross the boundary as their registry key
 * (the handle's integer value).
 * Nothing here is exported from libvllm.so (-fvisibility=hidden).
 */

#ifndef LIBVLLM_GLUE_H
#define LIBVLLM_GLUE_H

#include "vllm.h"

/* GLUE_PYTHON_BEGIN */
vllm_status glue_init(void);
vllm_status glue_shutdown(void);
vllm_status glue_engine_create(const char *model_path, const vllm_engine_params *params,
                               uint64_t *engine);
vllm_status glue_engine_free(uint64_t engine);
vllm_status glue_engine_model_info(uint64_t engine, vllm_model_info *out);
vllm_status glue_model_meta_count(uint64_t engine, size_t *n);
vllm_status glue_model_meta_key(uint64_t engine, size_t index, char *buf, size_t capacity,
                                size_t *n_bytes);
vllm_status glue_model_meta_value(uint64_t engine, const char *key, char *buf,
                                  size_t capacity, size_t *n_bytes);
vllm_status glue_tokenize(uint64_t engine, const char *text, size_t text_len,
                          int32_t add_special, int32_t parse_special, int32_t *tokens,
                          size_t capacity, size_t *n_tokens);
vllm_status glue_detokenize(uint64_t engine, const int32_t *tokens, size_t n_tokens,
                            int32_t skip_special_tokens, char *buf, size_t capacity,
                            size_t *n_bytes);
vllm_status glue_chat_template_apply(uint64_t engine, const char *messages_json,
                                     int32_t add_generation_prompt, char **out);
vllm_status glue_request_add(uint64_t engine, const char *request_id, const char *prompt,
                             const int32_t *prompt_token_ids, size_t n_prompt_token_ids,
                             const vllm_sampling_params *params);
vllm_status glue_request_abort(uint64_t engine, const char *request_id);
vllm_status glue_engine_step(uint64_t engine, const vllm_request_output **outputs,
                             size_t *n_outputs);
vllm_status glue_engine_num_unfinished(uint64_t engine, size_t *n);
vllm_status glue_log_configure(void);
vllm_status glue_token_to_piece(uint64_t engine, int32_t token, int32_t special, char *buf,
                                size_t capacity, size_t *n_bytes);
vllm_status glue_chat_template_render(uint64_t engine, const char *messages_json,
                                      const char *tools_json, int32_t add_generation_prompt,
                                      char **out);
vllm_status glue_engine_metrics(uint64_t engine, vllm_metrics *out);
vllm_status glue_engine_start_loop(uint64_t engine);
vllm_status glue_request_submit(uint64_t engine, const char *request_id, const char *prompt,
                                const int32_t *prompt_token_ids, size_t n_prompt_token_ids,
                                const vllm_sampling_params *params, vllm_event_callback callback,
                                void *user_data, uint64_t *request);
vllm_status glue_request_next(uint64_t request, int32_t timeout_ms, const vllm_event **event);
vllm_status glue_request_cancel(uint64_t request);
vllm_status glue_request_free(uint64_t request);
vllm_status glue_openai_request(uint64_t engine, const char *method, const char *endpoint,
                                const char *body, size_t body_size, uint32_t flags,
                                int32_t *http_status, char **response_json, uint64_t *stream);
vllm_status glue_openai_stream_next(uint64_t stream, int32_t timeout_ms, char **chunk_json);
vllm_status glue_openai_stream_cancel(uint64_t stream);
vllm_status glue_openai_stream_free(uint64_t stream);
vllm_status glue_engine_check_health(uint64_t engine);
vllm_status glue_engine_reset_prefix_cache(uint64_t engine);
vllm_status glue_embed(uint64_t engine, const char *const *texts, const size_t *text_lens,
                       const int32_t *const *token_ids, const size_t *n_token_ids,
                       size_t n_inputs, int32_t dimensions, float *out, size_t capacity,
                       size_t *n_floats, size_t *dim);
/* GLUE_PYTHON_END */

/* GLUE_C_BEGIN */
/* Sets this thread's last error (vllm_last_error). */
void glue_set_error(const char *message);
/* Records why the Python side could not start (called by the start-up code). */
void glue_set_start_error(const char *message);
/* The folder that holds capi/, engine/ and kernels/ (found from the library's location). */
const char *glue_python_path(void);
/* 1 if libvllm started the interpreter, 0 if the host process runs Python itself. */
int glue_owns_interpreter(void);
/* A malloc'd NUL-terminated copy of data[0..size), for vllm_string_free; NULL if OOM. */
char *glue_strndup(const char *data, size_t size);
/* The log callback's minimum level, or -1 when none is set (vllm_log_set). */
int32_t glue_log_level(void);
/* Hands one message to the log callback if it is set and level is high enough. */
void glue_log(int32_t level, const char *message);
/* Call a caller's callback (cffi releases the GIL around these calls). */
void glue_emit_event(vllm_event_callback callback, const vllm_event *event, void *user_data);
int32_t glue_emit_progress(vllm_progress_callback callback, float progress, void *user_data);
/* GLUE_C_END */

#endif /* LIBVLLM_GLUE_H */
