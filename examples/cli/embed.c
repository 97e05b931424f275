/*
 * examples/cli/embed.c - `vllm-cli embed`: one embedding vector per prompt, printed as a
 * JSON array of floats per line, in prompt order (vllm_embed on an engine created with
 * runner "pooling", vLLM's `--runner pooling --convert embed`).
 *
 *   vllm-cli embed -m MODEL -p TEXT [-p TEXT ...] [--pooler-config JSON] [options]
 *
 * Exit status: 0 done, 1 an error reported by the library, 2 a usage error.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embed.h"
#include "vllm.h"

static const char embed_usage[] =
    "usage: vllm-cli embed -m MODEL -p TEXT [-p TEXT ...] [options]\n"
    "\n"
    "Prints one embedding per prompt, a JSON array of floats per line, in prompt order\n"
    "(the model run as an embedding model: vLLM's --runner pooling --convert embed).\n"
    "\n"
    "options:\n"
    "  -m, --model PATH         GGUF model file (required)\n"
    "  -p, --prompt TEXT        a text to embed (repeat for a batch; at least one)\n"
    "      --pooler-config JSON vLLM's PoolerConfig, e.g. '{\"pooling_type\": \"MEAN\"}'\n"
    "                           (default: the last token's hidden state, normalized)\n"
    "      --dimensions N       matryoshka truncation (models that support it)\n"
    "      --max-model-len N    context length in tokens (default 2048)\n"
    "  -t, --threads N          CPU threads for tensor work; 0 is one per core (default 0)\n"
    "  -h, --help               show this help and exit\n";

enum { EMBED_EXIT_LIBRARY = 1, EMBED_EXIT_USAGE = 2 };

static int embed_usage_error(const char *message, const char *detail) {
    fprintf(stderr, "vllm-cli: error: %s%s\nTry 'vllm-cli embed --help'.\n", message, detail);
    return EMBED_EXIT_USAGE;
}

static int embed_library_error(vllm_status status) {
    const char *message = vllm_last_error();
    fprintf(stderr, "vllm-cli: error: %s\n", message[0] ? message : vllm_status_string(status));
    return EMBED_EXIT_LIBRARY;
}

/* *out = text as an int in [min, INT32_MAX]; -1 if it is not one. */
static int embed_int(const char *text, long min, int32_t *out) {
    char *end;
    long value;
    errno = 0;
    value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min || value > INT32_MAX) return -1;
    *out = (int32_t)value;
    return 0;
}

typedef struct {
    const char *model;
    const char **prompts;
    size_t n_prompts;
    int32_t dimensions;
    vllm_engine_params params;
} embed_options;

/* Fills *o; returns -1 to go on, else the exit status. */
static int embed_parse(int argc, char **argv, embed_options *o) {
    int i;
    for (i = 2; i < argc; i++) {
        const char *arg = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            fputs(embed_usage, stdout);
            return 0;
        }
        if (arg[0] != '-') return embed_usage_error("unexpected argument: ", arg);
        if (value == NULL) return embed_usage_error("missing value for ", arg);
        i++;
        if (strcmp(arg, "-m") == 0 || strcmp(arg, "--model") == 0) {
            o->model = value;
        } else if (strcmp(arg, "-p") == 0 || strcmp(arg, "--prompt") == 0) {
            o->prompts[o->n_prompts++] = value;
        } else if (strcmp(arg, "--pooler-config") == 0) {
            o->params.pooler_config = value;
        } else if (strcmp(arg, "--dimensions") == 0) {
            if (embed_int(value, 1, &o->dimensions) != 0)
                return embed_usage_error("not a valid number: ", arg);
        } else if (strcmp(arg, "--max-model-len") == 0) {
            if (embed_int(value, 0, &o->params.max_model_len) != 0)
                return embed_usage_error("not a valid number: ", arg);
        } else if (strcmp(arg, "-t") == 0 || strcmp(arg, "--threads") == 0) {
            if (embed_int(value, 0, &o->params.n_threads) != 0)
                return embed_usage_error("not a valid number: ", arg);
        } else {
            return embed_usage_error("unknown option: ", arg);
        }
    }
    if (o->model == NULL) return embed_usage_error("missing --model", "");
    if (o->n_prompts == 0) return embed_usage_error("embed needs --prompt", "");
    return -1;
}

/* Embeds the prompts (two-call sizing) and prints them; returns the exit status. */
static int embed_run(vllm_engine *engine, const embed_options *o) {
    size_t n_floats = 0, dim = 0, i, j;
    float *vectors;
    vllm_status status = vllm_embed(engine, o->prompts, NULL, NULL, NULL, o->n_prompts,
                                    o->dimensions, NULL, 0, &n_floats, &dim);
    if (status != VLLM_ERR_BUFFER_TOO_SMALL) return embed_library_error(status);
    if ((vectors = malloc(n_floats * sizeof *vectors)) == NULL) {
        fputs("vllm-cli: error: out of memory\n", stderr);
        return EMBED_EXIT_LIBRARY;
    }
    status = vllm_embed(engine, o->prompts, NULL, NULL, NULL, o->n_prompts, o->dimensions,
                        vectors, n_floats, &n_floats, &dim);
    if (status != VLLM_OK) {
        free(vectors);
        return embed_library_error(status);
    }
    for (i = 0; i < o->n_prompts; i++) {
        putchar('[');
        for (j = 0; j < dim; j++) printf(j ? ", %.9g" : "%.9g", (double)vectors[i * dim + j]);
        puts("]");
    }
    free(vectors);
    return 0;
}

int cli_embed(int argc, char **argv) {
    embed_options o;
    vllm_engine *engine = NULL;
    vllm_status status;
    int rc;
    memset(&o, 0, sizeof o);
    vllm_engine_params_init(&o.params, sizeof o.params);
    o.params.max_model_len = 2048;
    o.params.runner = "pooling";
    o.prompts = malloc((size_t)argc * sizeof *o.prompts);  /* at most one per argument */
    if (o.prompts == NULL) return EMBED_EXIT_LIBRARY;
    rc = embed_parse(argc, argv, &o);
    if (rc < 0) {
        if ((status = vllm_engine_create(o.model, &o.params, &engine)) != VLLM_OK)
            rc = embed_library_error(status);
        else
            rc = embed_run(engine, &o);
        vllm_engine_free(engine);
        vllm_shutdown();
    }
    free((void *)o.prompts);
    return rc;
}
