/*
 * examples/cli/vllm-cli.c - a command-line client of include/vllm.h and nothing else.
 *
 *   vllm-cli generate -m MODEL -p PROMPT [options]   stream the completion of a raw prompt
 *   vllm-cli chat -m MODEL [options]                 multi-turn chat, one message per line
 *   vllm-cli chat -m MODEL --prompt TEXT             one chat turn, then exit
 *
 * Chat keeps the conversation as OpenAI-style messages JSON, renders it with the
 * model's chat template (vllm_chat_template_apply), tokenizes it without adding
 * special tokens, adds the request by token ids and streams it with vllm_engine_step.
 * Exit status: 0 done, 1 an error reported by the library, 2 a usage error.
 */

#define _POSIX_C_SOURCE 200809L /* getline, clock_gettime, isatty */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "progress.h"
#include "vllm.h"

static const char usage_text[] =
    "usage: vllm-cli generate -m MODEL -p PROMPT [options]\n"
    "       vllm-cli chat -m MODEL [-p PROMPT] [options]\n"
    "       vllm-cli embed -m MODEL -p TEXT [-p TEXT ...]   (vllm-cli embed --help)\n"
    "\n"
    "commands:\n"
    "  generate                 stream the completion of a raw prompt (no chat template)\n"
    "  chat                     chat with the model: one user message per line on stdin,\n"
    "                           /exit or end of input quits; with --prompt, answer that\n"
    "                           one message and exit\n"
    "\n"
    "options:\n"
    "  -m, --model PATH         GGUF model file (required)\n"
    "  -p, --prompt TEXT        generate: the prompt; chat: a single user message\n"
    "  -s, --system TEXT        chat: the system prompt\n"
    "  -n, --max-tokens N       most tokens per answer (default 256)\n"
    "      --temp, --temperature T\n"
    "                           sampling temperature; 0 is greedy, so answers are\n"
    "                           reproducible (default 0)\n"
    "      --top-p P            keep the smallest token set whose probability is >= P,\n"
    "                           in (0, 1] (default 1)\n"
    "      --top-k K            keep the K most likely tokens; 0 is off (default 0)\n"
    "      --min-p P            drop tokens less likely than P times the most likely one,\n"
    "                           in [0, 1]; 0 is off (default 0)\n"
    "      --repeat-penalty R   divide (multiply when negative) the logits of tokens seen in\n"
    "                           the prompt or the answer by R; 1 is off (default 1)\n"
    "      --presence-penalty P subtract P from the logits of tokens the answer has used,\n"
    "                           in [-2, 2] (default 0)\n"
    "      --frequency-penalty F\n"
    "                           subtract F times each token's count in the answer so far,\n"
    "                           in [-2, 2] (default 0)\n"
    "      --seed N             sampling seed (default: random)\n"
    "      --max-model-len N    context length in tokens (default 2048)\n"
    "  -t, --threads N          CPU threads for tensor work; 0 is one per core (default 0)\n"
    "      --grammar GRAMMAR    constrain answers to a GBNF/EBNF (llama.cpp) or Lark grammar\n"
    "      --grammar-file FILE  the same, read from FILE\n"
    "  -j, --json-schema SCHEMA answers are JSON following this JSON schema\n"
    "  -q, --quantization Q     fp8 | compressed-tensors (default: the checkpoint's)\n"
    "      --kv-cache-dtype D   auto (the model's dtype, default) | fp8 | fp8_e4m3\n"
    "      --calculate-kv-scales  compute the fp8 KV cache's scales from the data\n"
    "      --mamba-cache-dtype D, --mamba-ssm-cache-dtype D\n"
    "                           hybrid models' state: auto | float32 | float16 | bfloat16\n"
    "      --mamba-cache-mode M none | align (default: align with prefix caching)\n"
    "  -h, --help               show this help and exit\n"
    "\n"
    "After each answer, stderr gets a line\n"
    "  [prompt tokens: N, completion tokens: M, X tok/s]\n"
    "with X measured from adding the request to its last token. While the model loads,\n"
    "stderr shows its progress: a bar on a terminal, else a line per 10%.\n";

typedef struct {
    const char *command, *model, *prompt, *system;
    long max_tokens, top_k, max_model_len, threads;
    double temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    long long seed; int has_seed;
    const char *grammar;      /* --grammar, or the text of --grammar-file */
    const char *grammar_file, *json_schema;
    vllm_engine_params engine; /* the engine flags named as vLLM's (-q, --kv-cache-dtype...) */
} options;

enum { EXIT_LIBRARY_ERROR = 1, EXIT_USAGE = 2 };

/* ------------------------------------------------------------------------- */
/* Errors and small utilities                                                 */
/* ------------------------------------------------------------------------- */

/* Reports the library's last error; returns -1 for the caller to pass up. */
static int library_error(vllm_status status) {
    const char *message = vllm_last_error();
    fprintf(stderr, "vllm-cli: error: %s\n", message[0] ? message : vllm_status_string(status));
    return -1;
}

static int usage_error(const char *message, const char *detail) {
    fprintf(stderr, "vllm-cli: error: %s%s\nTry 'vllm-cli --help'.\n", message, detail);
    return EXIT_USAGE;
}

static void *xrealloc(void *ptr, size_t size) {
    void *grown = realloc(ptr, size);
    if (grown == NULL) {
        fputs("vllm-cli: error: out of memory\n", stderr);
        exit(EXIT_LIBRARY_ERROR);
    }
    return grown;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A growing NUL-terminated string. */
typedef struct { char *data; size_t len, cap; } buffer;

static void buffer_append(buffer *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->data = xrealloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void buffer_puts(buffer *b, const char *s) { buffer_append(b, s, strlen(s)); }

/* s as a JSON string literal (UTF-8 passes through). */
static void buffer_json_string(buffer *b, const char *s) {
    buffer_puts(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char escaped[8];
        switch (c) {
        case '"': buffer_puts(b, "\\\""); break;
        case '\\': buffer_puts(b, "\\\\"); break;
        case '\n': buffer_puts(b, "\\n"); break;
        case '\r': buffer_puts(b, "\\r"); break;
        case '\t': buffer_puts(b, "\\t"); break;
        default:
            if (c < 0x20) {
                snprintf(escaped, sizeof escaped, "\\u%04x", c);
                buffer_puts(b, escaped);
            } else {
                buffer_append(b, s, 1);
            }
        }
    }
    buffer_puts(b, "\"");
}

/* ------------------------------------------------------------------------- */
/* Command line                                                               */
/* ------------------------------------------------------------------------- */

typedef enum {
    OPT_MODEL, OPT_PROMPT, OPT_SYSTEM, OPT_MAX_TOKENS, OPT_TEMPERATURE, OPT_TOP_P, OPT_TOP_K,
    OPT_MIN_P, OPT_REPEAT_PENALTY, OPT_PRESENCE_PENALTY, OPT_FREQUENCY_PENALTY,
    OPT_SEED, OPT_MAX_MODEL_LEN, OPT_THREADS, OPT_GRAMMAR, OPT_GRAMMAR_FILE, OPT_JSON_SCHEMA,
    OPT_ENGINE_TEXT, OPT_CALCULATE_KV_SCALES
} option_id;

static const struct {
    const char *short_name, *long_name, *alias;
    option_id id;
    size_t field; /* OPT_ENGINE_TEXT: the offset of its vllm_engine_params string */
} flags[] = {
    {"-m", "--model", NULL, OPT_MODEL, 0},
    {"-p", "--prompt", NULL, OPT_PROMPT, 0},
    {"-s", "--system", NULL, OPT_SYSTEM, 0},
    {"-n", "--max-tokens", NULL, OPT_MAX_TOKENS, 0},
    {NULL, "--temperature", "--temp", OPT_TEMPERATURE, 0},
    {NULL, "--top-p", NULL, OPT_TOP_P, 0},
    {NULL, "--top-k", NULL, OPT_TOP_K, 0},
    {NULL, "--min-p", NULL, OPT_MIN_P, 0},
    {NULL, "--repeat-penalty", NULL, OPT_REPEAT_PENALTY, 0},
    {NULL, "--presence-penalty", NULL, OPT_PRESENCE_PENALTY, 0},
    {NULL, "--frequency-penalty", NULL, OPT_FREQUENCY_PENALTY, 0},
    {NULL, "--seed", NULL, OPT_SEED, 0},
    {NULL, "--max-model-len", NULL, OPT_MAX_MODEL_LEN, 0},
    {"-t", "--threads", NULL, OPT_THREADS, 0},
    {NULL, "--grammar", NULL, OPT_GRAMMAR, 0},
    {NULL, "--grammar-file", NULL, OPT_GRAMMAR_FILE, 0},
    {"-j", "--json-schema", NULL, OPT_JSON_SCHEMA, 0},
#define ENGINE_TEXT(field) OPT_ENGINE_TEXT, offsetof(vllm_engine_params, field)
    {"-q", "--quantization", NULL, ENGINE_TEXT(quantization)},
    {NULL, "--kv-cache-dtype", NULL, ENGINE_TEXT(kv_cache_dtype)},
    {NULL, "--mamba-cache-dtype", NULL, ENGINE_TEXT(mamba_cache_dtype)},
    {NULL, "--mamba-ssm-cache-dtype", NULL, ENGINE_TEXT(mamba_ssm_cache_dtype)},
    {NULL, "--mamba-cache-mode", NULL, ENGINE_TEXT(mamba_cache_mode)},
    {NULL, "--calculate-kv-scales", NULL, OPT_CALCULATE_KV_SCALES, 0}, /* takes no value */
};

static int same(const char *a, const char *b) { return a != NULL && strcmp(a, b) == 0; }

static int find_flag(const char *name) {
    size_t i;
    for (i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (same(flags[i].short_name, name) || same(flags[i].long_name, name) ||
            same(flags[i].alias, name))
            return (int)i;
    return -1;
}

static int parse_integer(const char *text, long long min, long long max, long long *out) {
    char *end;
    long long value;
    errno = 0;
    value = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min || value > max) return -1;
    *out = value;
    return 0;
}

static int parse_number(const char *text, double *out) {
    char *end;
    errno = 0;
    *out = strtod(text, &end);
    return errno != 0 || end == text || *end != '\0' ? -1 : 0;
}

/* *out = text as an integer in [min, INT32_MAX]; -1 if it is not one. */
static int parse_int32(const char *text, long long min, long *out) {
    long long n = 0;
    if (parse_integer(text, min, INT32_MAX, &n) != 0) return -1;
    *out = (long)n;
    return 0;
}

/* Stores one flag's value; -1 if it is not a valid number. */
static int set_option(options *o, int flag, const char *value) {
    switch (flags[flag].id) {
    case OPT_MODEL: o->model = value; return 0;
    case OPT_PROMPT: o->prompt = value; return 0;
    case OPT_SYSTEM: o->system = value; return 0;
    case OPT_GRAMMAR: o->grammar = value; return 0;
    case OPT_GRAMMAR_FILE: o->grammar_file = value; return 0;
    case OPT_JSON_SCHEMA: o->json_schema = value; return 0;
    case OPT_TEMPERATURE: return parse_number(value, &o->temperature);
    case OPT_TOP_P: return parse_number(value, &o->top_p);
    case OPT_MIN_P: return parse_number(value, &o->min_p);
    case OPT_REPEAT_PENALTY: return parse_number(value, &o->repeat_penalty);
    case OPT_PRESENCE_PENALTY: return parse_number(value, &o->presence_penalty);
    case OPT_FREQUENCY_PENALTY: return parse_number(value, &o->frequency_penalty);
    case OPT_SEED: o->has_seed = 1; return parse_integer(value, INT64_MIN, INT64_MAX, &o->seed);
    case OPT_MAX_TOKENS: return parse_int32(value, INT32_MIN, &o->max_tokens);
    case OPT_TOP_K: return parse_int32(value, INT32_MIN, &o->top_k);
    case OPT_MAX_MODEL_LEN: return parse_int32(value, 0, &o->max_model_len);
    case OPT_THREADS: return parse_int32(value, 0, &o->threads);
    case OPT_ENGINE_TEXT: /* checked by the library: its message names a bad value */
        *(const char **)(void *)((char *)&o->engine + flags[flag].field) = value;
        return 0;
    case OPT_CALCULATE_KV_SCALES: o->engine.calculate_kv_scales = 1; return 0;
    }
    return -1;
}

#include "embed.h" /* `vllm-cli embed` parses its own arguments (examples/cli/embed.c) */
/* Fills *o from argv. Returns -1 to go on, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, options *o) {
    int i;
    if (argc > 1 && same(argv[1], "embed")) return cli_embed(argc, argv);
    memset(o, 0, sizeof *o);
    o->max_tokens = 256;
    o->top_p = o->repeat_penalty = 1.0;
    o->max_model_len = 2048;
    vllm_engine_params_init(&o->engine, sizeof o->engine); /* pure C: no runtime yet */
    for (i = 1; i < argc; i++) {
        char name[64];
        const char *arg = argv[i], *value, *eq = strchr(arg, '=');
        int flag;
        if (same(arg, "-h") || same(arg, "--help")) return fputs(usage_text, stdout) == EOF;
        if (arg[0] != '-' && o->command == NULL) {
            o->command = arg;
            continue;
        }
        if (arg[0] != '-') return usage_error("unexpected argument: ", arg);
        snprintf(name, sizeof name, "%.*s", (int)(eq && arg[1] == '-' ? eq - arg : 63), arg);
        if ((flag = find_flag(name)) < 0) return usage_error("unknown option: ", arg);
        if (flags[flag].id == OPT_CALCULATE_KV_SCALES)
            value = eq == NULL ? "" : NULL;
        else if (eq != NULL && arg[1] == '-')
            value = eq + 1;
        else if (i + 1 < argc)
            value = argv[++i];
        else
            return usage_error("missing value for ", arg);
        if (value == NULL) return usage_error("takes no value: ", arg);
        if (set_option(o, flag, value) != 0)
            return usage_error("not a valid number: ", arg);
    }
    if (o->command == NULL) return usage_error("missing command (generate or chat)", "");
    if (!same(o->command, "generate") && !same(o->command, "chat"))
        return usage_error("unknown command: ", o->command);
    if (o->model == NULL) return usage_error("missing --model", "");
    if (same(o->command, "generate") && o->prompt == NULL)
        return usage_error("generate needs --prompt", "");
    if ((o->grammar != NULL) + (o->grammar_file != NULL) + (o->json_schema != NULL) > 1)
        return usage_error("give one of --grammar, --grammar-file, --json-schema", "");
    return -1;
}

/* The whole file as a NUL-terminated string (the caller frees it), or NULL. */
static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    buffer b = {0};
    char chunk[4096];
    size_t n;
    if (f == NULL) return NULL;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) buffer_append(&b, chunk, n);
    fclose(f);
    if (b.data == NULL) buffer_append(&b, "", 0);
    return b.data;
}

static vllm_sampling_params sampling_params(const options *o) {
    vllm_sampling_params sp;
    vllm_sampling_params_init(&sp, sizeof sp);
    sp.max_tokens = (int32_t)o->max_tokens;
    sp.temperature = (float)o->temperature;
    sp.top_p = (float)o->top_p;
    sp.top_k = (int32_t)o->top_k;
    sp.min_p = (float)o->min_p;
    sp.repetition_penalty = (float)o->repeat_penalty;
    sp.presence_penalty = (float)o->presence_penalty;
    sp.frequency_penalty = (float)o->frequency_penalty;
    sp.seed = (int64_t)o->seed;
    sp.has_seed = o->has_seed;
    sp.grammar = o->grammar;
    sp.json_schema = o->json_schema;
    return sp;
}

/* ------------------------------------------------------------------------- */
/* Generation                                                                 */
/* ------------------------------------------------------------------------- */

/* Adds one request (text prompt or token ids), streams its text to stdout and, if
 * answer is not NULL, into it; then prints the token counts to stderr. */
static int stream_request(vllm_engine *engine, const char *prompt, const int32_t *ids,
                          size_t n_ids, const vllm_sampling_params *sp, buffer *answer) {
    static unsigned long counter;
    char request_id[32];
    int32_t n_prompt = 0, n_output = 0;
    int finished = 0;
    double start = now_seconds(), elapsed;
    vllm_status status;
    snprintf(request_id, sizeof request_id, "cli-%lu", ++counter);
    if ((status = vllm_request_add(engine, request_id, prompt, ids, n_ids, sp)) != VLLM_OK)
        return library_error(status);
    while (!finished) {
        const vllm_request_output *outputs;
        size_t n, k;
        if ((status = vllm_engine_step(engine, &outputs, &n)) != VLLM_OK)
            return library_error(status);
        for (k = 0; k < n; k++) {
            if (strcmp(outputs[k].request_id, request_id) != 0) continue;
            fputs(outputs[k].text, stdout);
            fflush(stdout);
            if (answer != NULL) buffer_puts(answer, outputs[k].text);
            n_prompt = outputs[k].num_prompt_tokens;
            n_output = outputs[k].num_output_tokens;
            finished = outputs[k].finished;
        }
    }
    elapsed = now_seconds() - start;
    fputc('\n', stdout);
    fflush(stdout);
    fprintf(stderr, "[prompt tokens: %d, completion tokens: %d, %.1f tok/s]\n", n_prompt,
            n_output, elapsed > 0 ? n_output / elapsed : 0.0);
    return 0;
}

static int generate(vllm_engine *engine, const options *o) {
    vllm_sampling_params sp = sampling_params(o);
    return stream_request(engine, o->prompt, NULL, 0, &sp, NULL);
}

/* ------------------------------------------------------------------------- */
/* Chat                                                                       */
/* ------------------------------------------------------------------------- */

/* history holds a JSON array of messages without its closing ']'. */
static void add_message(buffer *history, const char *role, const char *content) {
    buffer_puts(history, history->len > 1 ? ",{\"role\":" : "{\"role\":");
    buffer_json_string(history, role);
    buffer_puts(history, ",\"content\":");
    buffer_json_string(history, content);
    buffer_puts(history, "}");
}

/* The rendered conversation as token ids (malloc'd into *ids). */
static int render_tokens(vllm_engine *engine, buffer *history, int32_t **ids, size_t *n) {
    char *prompt = NULL;
    vllm_status status;
    buffer_puts(history, "]");
    status = vllm_chat_template_apply(engine, history->data, 1, &prompt);
    history->data[--history->len] = '\0';
    if (status != VLLM_OK) return library_error(status);
    status = vllm_tokenize(engine, prompt, strlen(prompt), 0, 1, NULL, 0, n);
    if (status == VLLM_ERR_BUFFER_TOO_SMALL) {
        *ids = xrealloc(NULL, *n * sizeof **ids);
        status = vllm_tokenize(engine, prompt, strlen(prompt), 0, 1, *ids, *n, n);
    }
    vllm_string_free(prompt);
    return status == VLLM_OK ? 0 : library_error(status);
}

static int chat_turn(vllm_engine *engine, buffer *history, const char *message,
                     const vllm_sampling_params *sp) {
    int32_t *ids = NULL;
    size_t n = 0;
    buffer answer = {NULL, 0, 0};
    int rc;
    add_message(history, "user", message);
    rc = render_tokens(engine, history, &ids, &n);
    if (rc == 0) rc = stream_request(engine, NULL, ids, n, sp, &answer);
    if (rc == 0) add_message(history, "assistant", answer.data != NULL ? answer.data : "");
    free(ids);
    free(answer.data);
    return rc;
}

/* Reads user messages from stdin until /exit or end of input. */
static int chat_loop(vllm_engine *engine, buffer *history, const vllm_sampling_params *sp) {
    char *line = NULL;
    size_t size = 0;
    ssize_t len = 0;
    int interactive = isatty(STDIN_FILENO), rc = 0;
    for (;;) {
        if (interactive) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        if ((len = getline(&line, &size, stdin)) < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (same(line, "/exit")) break;
        if (len == 0) continue;
        if ((rc = chat_turn(engine, history, line, sp)) != 0) break;
    }
    if (interactive && len < 0) fputc('\n', stdout);
    free(line);
    return rc;
}

static int chat(vllm_engine *engine, const options *o) {
    vllm_sampling_params sp = sampling_params(o);
    buffer history = {NULL, 0, 0};
    int rc;
    buffer_puts(&history, "[");
    if (o->system != NULL) add_message(&history, "system", o->system);
    if (o->prompt != NULL)
        rc = chat_turn(engine, &history, o->prompt, &sp);
    else
        rc = chat_loop(engine, &history, &sp);
    free(history.data);
    return rc;
}

/* ------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    options o;
    vllm_engine_params params;
    vllm_engine *engine = NULL;
    vllm_status status;
    cli_progress progress;
    char *grammar_text = NULL;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    if (o.grammar_file != NULL) {
        if ((grammar_text = read_file(o.grammar_file)) == NULL)
            return usage_error("cannot read --grammar-file ", o.grammar_file);
        o.grammar = grammar_text;
    }
    params = o.engine;
    params.max_model_len = (int32_t)o.max_model_len;
    params.n_threads = (int32_t)o.threads;
    cli_progress_install(&progress, &params);
    status = vllm_engine_create(o.model, &params, &engine);
    cli_progress_end(&progress);
    if (status != VLLM_OK)
        rc = library_error(status);
    else if (same(o.command, "generate"))
        rc = generate(engine, &o);
    else
        rc = chat(engine, &o);
    vllm_engine_free(engine);
    vllm_shutdown();
    free(grammar_text);
    return rc == 0 ? 0 : EXIT_LIBRARY_ERROR;
}
