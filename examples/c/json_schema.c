/*
 * examples/c/json_schema.c - structured output: the model's answer is JSON that follows a
 * JSON schema, whatever it would have said (the grammar masks every other token).
 *
 *   cc -std=c11 -Iinclude examples/c/json_schema.c -Lbuild -lvllm -Wl,-rpath,$PWD/build \
 *      -o json_schema
 *   ./json_schema MODEL.gguf "Describe a person as JSON." [SEED]
 *
 * Prints the JSON (PROMPT must not contain quotes: it is pasted into a JSON string).
 * A schema the engine cannot compile is refused by
 * vllm_request_add with VLLM_ERR_INVALID_ARGUMENT and the reason.
 */

#include <stdio.h>
#include <stdlib.h>

#include "vllm.h"

static const char *SCHEMA =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"maxLength\": 20},"
    "\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 120},"
    "\"languages\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"maxLength\": 12},"
    " \"maxItems\": 3}},"
    "\"required\": [\"name\", \"age\", \"languages\"], \"additionalProperties\": false}";

static int fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, vllm_last_error());
    vllm_shutdown();
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [SEED]\n", argv[0]);
        return 2;
    }
    vllm_engine_params params;
    vllm_engine_params_init(&params, sizeof params);
    params.max_model_len = 1024;

    vllm_engine *engine = NULL;
    if (vllm_engine_create(argv[1], &params, &engine) != VLLM_OK) return fail("create");

    /* The chat template turns the user message into the model's prompt. */
    char messages[1024];
    snprintf(messages, sizeof messages, "[{\"role\": \"user\", \"content\": \"%s\"}]", argv[2]);
    char *prompt = NULL;
    if (vllm_chat_template_apply(engine, messages, 1, &prompt) != VLLM_OK)
        return fail("template");

    vllm_sampling_params sp;
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.max_tokens = 200;
    sp.temperature = 0.8f;
    sp.seed = argc == 4 ? atoll(argv[3]) : 0;
    sp.has_seed = 1;
    sp.json_schema = SCHEMA;
    vllm_status status = vllm_request_add(engine, "json-0", prompt, NULL, 0, &sp);
    vllm_string_free(prompt);
    if (status != VLLM_OK) return fail("add");

    size_t unfinished = 1;
    int32_t finish = VLLM_FINISH_NONE;
    while (unfinished > 0) {
        const vllm_request_output *outs = NULL;
        size_t n = 0;
        if (vllm_engine_step(engine, &outs, &n) != VLLM_OK) return fail("step");
        for (size_t i = 0; i < n; i++) {
            fputs(outs[i].text, stdout);
            if (outs[i].finished) finish = outs[i].finish_reason;
        }
        if (vllm_engine_num_unfinished(engine, &unfinished) != VLLM_OK) return fail("count");
    }
    putchar('\n');
    vllm_engine_free(engine);
    vllm_shutdown();
    return finish == VLLM_FINISH_STOP ? 0 : 3; /* LENGTH: max_tokens cut the JSON short */
}
