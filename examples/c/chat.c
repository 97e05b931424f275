/* examples/c/chat.c - one chat turn against an installed libvllm (greedy):
 *   cc chat.c $(pkg-config --cflags --libs libvllm) -o chat
 *   ./chat MODEL.gguf "What is the capital of France?" */
#include <stdio.h>
#include <vllm.h>

static int fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, vllm_last_error());
    vllm_shutdown();
    return 1;
}

int main(int argc, char **argv) {
    char messages[1024], *prompt = NULL;
    vllm_engine *engine = NULL;
    vllm_sampling_params sp;
    const vllm_request_output *out;
    size_t n, left = 1;
    if (argc != 3) return fprintf(stderr, "usage: %s MODEL.gguf QUESTION\n", argv[0]), 2;
    snprintf(messages, sizeof messages, "[{\"role\":\"user\",\"content\":\"%s\"}]", argv[2]);
    if (vllm_engine_create(argv[1], NULL, &engine)) return fail("create");
    if (vllm_chat_template_apply(engine, messages, 1, &prompt)) return fail("template");
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.temperature = 0.0f;
    sp.max_tokens = 48;
    if (vllm_request_add(engine, "chat", prompt, NULL, 0, &sp)) return fail("add");
    vllm_string_free(prompt);
    while (left > 0) {
        if (vllm_engine_step(engine, &out, &n)) return fail("step");
        for (size_t i = 0; i < n; i++) fputs(out[i].text, stdout);
        if (vllm_engine_num_unfinished(engine, &left)) return fail("count");
    }
    putchar('\n');
    vllm_engine_free(engine);
    vllm_shutdown();
    return 0;
}
