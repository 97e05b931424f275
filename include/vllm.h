/*
 * vllm.h - the public C API of libvllm, a vLLM-class LLM inference engine.
 *
 * Every capability of libvllm is a function of this header, exported from
 * libvllm.so (SONAME libvllm.so.<ABI major>). Link with `-lvllm`; nothing else.
 *
 * Conventions
 *   - Functions that can fail return a vllm_status (0 = VLLM_OK). On failure,
 *     vllm_last_error() describes what went wrong.
 *   - Handles are opaque. A handle used after it was freed returns
 *     VLLM_ERR_INVALID_HANDLE; it never crashes. vllm_*_free(NULL) is a no-op.
 *   - Pointer and count out-parameters are set to NULL / 0 on entry, so they are
 *     NULL / 0 on failure.
 *   - Parameter structs start with `uint32_t struct_size` and are filled with
 *     defaults by their *_init(params, sizeof *params) function, which writes only
 *     that many bytes and sets struct_size to it; the library reads
 *     min(struct_size, sizeof(struct)) bytes, so fields can be appended in later
 *     minor versions without breaking older callers (in either direction).
 *   - Memory the library returns says who owns it and for how long it stays valid.
 *     Strings the caller owns are freed with vllm_string_free().
 *   - Strings are UTF-8 and NUL-terminated.
 *
 * Thread safety (since 0.2)
 *   - vllm_version, vllm_abi_version, vllm_status_string, vllm_last_error,
 *     vllm_last_error_copy, vllm_log_set and the *_init functions may be called from
 *     any thread at any time; they never start the Python runtime.
 *   - Every other function may be called from any thread, also concurrently on one
 *     engine: the library serializes engine work internally. Several threads may step
 *     one engine (since 0.5): a request added with vllm_request_add belongs to the
 *     thread that added it, whose vllm_engine_step calls return its outputs (any
 *     thread's step advances every request); a thread's outputs stay valid until its
 *     own next step. A pool where some threads submit and others receive uses the
 *     background loop: any thread submits, any thread pulls a handle it was given
 *     (examples/c/worker_pool.c). Two rules remain: vllm_request_next /
 *     vllm_request_free on one request, and vllm_openai_stream_next / _free on one
 *     stream, must not overlap;
 *     and vllm_shutdown must not race with other calls.
 *   - The library leaves signals to the host (it installs no handler, also not
 *     Python's SIGINT handler) and never ends the host process. Unless the host set
 *     OMP_WAIT_POLICY before the runtime starts, it sets PASSIVE: the engine's CPU
 *     threads sleep between calls instead of spinning (since 0.5).
 *
 * Two ways to drive an engine (since 0.2; mixing them is VLLM_ERR_INVALID_STATE)
 *   - caller-driven: vllm_request_add + vllm_engine_step on the caller's thread,
 *     deterministic and single-threaded, like llama_decode;
 *   - background loop: vllm_engine_start_loop, then vllm_request_submit with a push
 *     callback or pulled with vllm_request_next, and the OpenAI layer
 *     (vllm_openai_request).
 *
 * Lifecycle
 *   The first call that needs the engine runtime starts it (a few seconds: it
 *   imports torch). vllm_init() does that at a time of your choice. Call
 *   vllm_shutdown() before the process exits: the embedded runtime has no exit hooks.
 */

#ifndef VLLM_H
#define VLLM_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#    define VLLM_API __attribute__((visibility("default")))
#    define VLLM_DEPRECATED(decl, hint) decl __attribute__((deprecated(hint)))
#else
#    define VLLM_API
#    define VLLM_DEPRECATED(decl, hint) decl
#endif

/* ABI version: the major changes on any incompatible change (and with it the SONAME). */
#define VLLM_ABI_VERSION_MAJOR 1
#define VLLM_ABI_VERSION_MINOR 3
#define VLLM_ABI_VERSION ((VLLM_ABI_VERSION_MAJOR << 16) | VLLM_ABI_VERSION_MINOR)

#ifdef __cplusplus
extern "C" {
#endif

/* VLLM_API_BEGIN */

/* ------------------------------------------------------------------------- */
/* Types                                                                      */
/* ------------------------------------------------------------------------- */

/* Status codes. The numbers are frozen: new codes are only ever appended. */
typedef int32_t vllm_status;
enum vllm_status_code {
    VLLM_OK = 0,
    VLLM_ERR_INVALID_ARGUMENT = 1,  /* a NULL pointer, a value out of range, bad JSON */
    VLLM_ERR_BUFFER_TOO_SMALL = 2,  /* two-call sizing: the required size was returned */
    VLLM_ERR_MODEL_LOAD = 3,        /* model path missing, unreadable or malformed */
    VLLM_ERR_UNSUPPORTED = 4,       /* well-formed input that is not implemented */
    VLLM_ERR_NOT_FOUND = 5,         /* unknown request id */
    VLLM_ERR_INVALID_HANDLE = 6,    /* a handle that was freed or never existed */
    VLLM_ERR_OUT_OF_RESOURCES = 7,  /* KV cache or memory cannot hold what was asked */
    VLLM_ERR_RUNTIME_INIT = 8,      /* the embedded Python runtime could not start */
    VLLM_ERR_INTERNAL = 9,          /* a bug: please report vllm_last_error() */
    VLLM_ERR_TIMEOUT = 10,          /* since 0.2: nothing arrived within timeout_ms */
    VLLM_END_OF_STREAM = 11,        /* since 0.2: the stream already ended (not an error:
                                       vllm_last_error() stays "") */
    VLLM_ERR_INVALID_STATE = 12,    /* since 0.2: not allowed now (e.g. a step while the
                                       background loop runs, a call after shutdown) */
    VLLM_ERR_CANCELLED = 13,        /* since 1.0: the caller stopped it (a progress
                                       callback returned 0) */
    VLLM_ERR_ENGINE_DEAD = 14       /* since 1.3: the engine's loop failed or its
                                       engine-core process died (vLLM's EngineDeadError;
                                       vllm_engine_check_health) */
};

/* Why a request finished (vllm_request_output.finish_reason). */
enum vllm_finish_reason {
    VLLM_FINISH_NONE = 0,    /* still running */
    VLLM_FINISH_STOP = 1,    /* EOS or a stop token */
    VLLM_FINISH_LENGTH = 2,  /* max_tokens or the context length reached */
    VLLM_FINISH_ABORT = 3,   /* vllm_request_abort(), vllm_request_cancel() */
    VLLM_FINISH_ERROR = 4    /* since 0.2: the engine failed (since 0.3 also: this request
                                alone failed, e.g. its grammar did not compile); see
                                vllm_event.status and vllm_event.error (since 1.0 also
                                vllm_request_output.status and .error) */,
    VLLM_FINISH_REPETITION = 5  /* since 1.2: the output repeated an n-gram (the sampling
                                   params' repetition_* fields; vLLM's "repetition") */
};

/* Log levels (the Python logging levels of the engine). Since 0.2. */
enum vllm_log_level {
    VLLM_LOG_DEBUG = 10,
    VLLM_LOG_INFO = 20,
    VLLM_LOG_WARNING = 30,
    VLLM_LOG_ERROR = 40
};

/* Receives one log message (UTF-8, no trailing newline, valid during the call). Runs
 * on the thread that logged, also library threads: it must be thread-safe. Since 0.2. */
typedef void (*vllm_log_callback)(int32_t level, const char *message, void *user_data);

/* Model loading progress in [0, 1], called on the thread of vllm_engine_create;
 * 1 comes once, when the weights are in place. Return nonzero to go on, 0 to abort
 * the load: vllm_engine_create then returns VLLM_ERR_CANCELLED (as llama.h's
 * progress_callback returning false). Since 0.2; returns int32_t since 1.0. */
typedef int32_t (*vllm_progress_callback)(float progress, void *user_data);

/* An engine: one loaded model, its KV cache and its requests. */
struct vllm_engine;
typedef struct vllm_engine vllm_engine;

/* Engine configuration (vLLM's EngineArgs). A field left 0 takes its default (which may
 * be "derived from the model or machine"); the on/off flags are plain (0 = off). A
 * zeroed struct with only struct_size set is valid. (vllm_sampling_params keeps vLLM's
 * checks instead: start it with vllm_sampling_params_init.) */
typedef struct vllm_engine_params {
    uint32_t struct_size;            /* sizeof(vllm_engine_params), set by _init */
    int32_t max_model_len;           /* context length; 0: the model's */
    const char *device;              /* "auto" (or NULL), "cpu", "cuda" */
    const char *dtype;               /* "auto" (or NULL), "float32", "bfloat16", "float16" */
    int32_t max_num_seqs;            /* max requests in one batch; default (0): vLLM's,
                                        1024 on a GPU of >= 70 GiB (not an A100), else
                                        256 (CPU, hybrid GDN models) */
    int32_t max_num_batched_tokens;  /* token budget of one step; 0: vLLM's LLM class,
                                        16384 on those GPUs, else 8192 (without
                                        chunked prefill: the context length) */
    int32_t block_size;              /* KV cache block size in tokens; default (0) 16 */
    int32_t enable_prefix_caching;   /* reuse KV blocks of shared prefixes; default 1 */
    int64_t kv_cache_memory_bytes;   /* KV cache size; 0: derived from device memory */
    int64_t seed;                    /* engine seed; default 0 */
    int32_t enable_chunked_prefill;  /* split long prompts over steps; default 1 */
    int32_t enforce_eager;           /* 1: no CUDA graphs; default 0 */
    /* since 0.2 */
    const char *served_model_name;   /* the model's name in model info and the OpenAI
                                        layer; NULL: the GGUF's name (model info) and the
                                        model path (OpenAI), as vLLM */
    const char *chat_template;       /* NULL: the model's; else a file path or the
                                        template text itself (vLLM's --chat-template) */
    vllm_progress_callback progress_callback;  /* NULL: none */
    void *progress_callback_user_data;
    const char *tokenizer;           /* NULL: the model's; else a Hugging Face tokenizer
                                        directory (tokenizer.json, tokenizer_config.json),
                                        as vLLM's --tokenizer */
    /* since 0.3: structured outputs, reasoning and tool calling (vLLM's serve flags) */
    const char *structured_outputs_backend; /* NULL or "auto" (xgrammar, else guidance),
                                               "xgrammar", "guidance" */
    const char *reasoning_parser;    /* NULL: none; "deepseek_r1", "qwen3": the OpenAI
                                        layer splits <think> text into `reasoning` */
    const char *tool_call_parser;    /* NULL: none; "hermes", "qwen3_json", "llama3_json",
                                        "llama4_json", "mistral", "pythonic", "qwen3_xml",
                                        "qwen3_coder" (vLLM's --tool-call-parser) */
    int32_t enable_auto_tool_choice; /* 1: tool_choice "auto" parses tool calls (needs
                                        tool_call_parser); default 0 */
    const char *load_format;         /* NULL or "auto": the model's weights; "dummy": random
                                        weights with the shapes of the config.json in the
                                        model directory (benchmarks), as vLLM's
                                        --load-format dummy */
    float gpu_memory_utilization;    /* CUDA: fraction of GPU memory for weights,
                                        activations and KV cache; default (0) 0.9 */
    int32_t skip_tokenizer_init;     /* 1: no tokenizer; token-id prompts only, outputs
                                        carry token ids and empty text; default 0 */
    /* since 0.4 */
    int32_t async_scheduling;        /* vLLM's --async-scheduling: schedule step N+1 while
                                        step N runs on the device. 1: on, -1: off,
                                        0 (default): on with CUDA, off on CPU */
    /* since 0.5 */
    int32_t n_threads;               /* CPU threads of the engine's tensor work (torch's
                                        intra-op pool, as llama.h's n_threads); 0
                                        (default): derived (torch: one per core; with
                                        CUDA 1 once the model is loaded, unless
                                        OMP_NUM_THREADS is set: vLLM's rule). Set in
                                        the engine core's process: with CUDA by default
                                        a child (the host keeps its own); in process,
                                        the last engine created sets it for threads
                                        that have not run torch work yet */
    int32_t multiprocessing;         /* vLLM's VLLM_ENABLE_V1_MULTIPROCESSING: the engine
                                        core (scheduler, model runner) in a child process.
                                        1: on, -1: off, 0 (default): the env var if set,
                                        else on with CUDA, off on CPU */
    /* since 1.0 */
    int32_t tensor_parallel_size;    /* vLLM's --tensor-parallel-size: devices the model
                                        is sharded over (one process per rank); 0 or 1
                                        (default): one */
    /* since 1.1 */
    const char *tool_strict_level;   /* vLLM's --tool-strict-level, the floor of strict
                                        tool calling for tool_choice "auto": NULL (the
                                        tool parser's default, "auto": constrain calls
                                        when a tool is `strict`), "function" (every
                                        call's name and envelope), "parameter" (also
                                        every tool's arguments, as if all were strict) */
    /* since 1.2: vLLM's --reasoning-config, the markers of a thinking_token_budget */
    const char *reasoning_start_str; /* opens a reasoning block; NULL: the reasoning
                                        parser's ("<think>" for qwen3 / deepseek_r1) */
    const char *reasoning_end_str;   /* forced when the budget is spent (may put a
                                        phrase before the parser's end marker); NULL:
                                        the parser's ("</think>") */
    /* since 1.3: quantization and cache dtypes (vLLM's flags of the same names; an
     * unknown value fails vllm_engine_create with VLLM_ERR_INVALID_ARGUMENT) */
    const char *quantization;        /* --quantization: NULL or "": the checkpoint's
                                        (config.json quantization_config, a GGUF's
                                        types); "fp8": an unquantized checkpoint's
                                        linear weights quantized at load (dynamic FP8);
                                        "compressed-tensors" */
    const char *kv_cache_dtype;      /* --kv-cache-dtype: NULL or "auto" (the model's
                                        dtype), "fp8", "fp8_e4m3" (fp8 is e4m3) */
    const char *mamba_cache_dtype;   /* --mamba-cache-dtype, hybrid models' recurrent
                                        state (conv and SSM): NULL or "auto" (from the
                                        model config), "float32", "float16", "bfloat16" */
    const char *mamba_ssm_cache_dtype; /* --mamba-ssm-cache-dtype, the SSM state only:
                                        NULL or "auto" (as mamba_cache_dtype), or one of
                                        its dtypes */
    const char *mamba_cache_mode;    /* --mamba-cache-mode, deprecated as in vLLM: no
                                        effect. The mode is always derived: "align" for a
                                        hybrid model with prefix caching, else "none".
                                        NULL or "": unset; "none", "align": ignored, with
                                        vLLM's deprecation warning in the log; any other
                                        value: VLLM_ERR_INVALID_ARGUMENT */
    int32_t calculate_kv_scales;     /* --calculate-kv-scales: 1 computes the fp8 KV
                                        cache's scales from the data; default 0 */
    /* since 1.3: pooling (vLLM's --runner, --convert, --pooler-config; an unknown value
     * fails vllm_engine_create with VLLM_ERR_INVALID_ARGUMENT) */
    const char *runner;              /* NULL or "auto" ("generate"; "pooling" when convert
                                        is set), "generate", "pooling": an engine that
                                        embeds (vllm_embed, /v1/embeddings) and does not
                                        generate */
    const char *convert;             /* NULL or "auto" ("embed" with runner "pooling"),
                                        "none", "embed" (a *ForCausalLM as an embedding
                                        model); "classify": VLLM_ERR_UNSUPPORTED */
    const char *pooler_config;       /* NULL: the converted model's pooler (LAST token,
                                        L2-normalized); else vLLM's PoolerConfig as JSON,
                                        e.g. {"pooling_type": "MEAN"} */
} vllm_engine_params;

/* What vllm_engine_model_info() reports. */
typedef struct vllm_model_info {
    uint32_t struct_size;       /* set by the caller to sizeof(vllm_model_info) */
    int32_t vocab_size;
    int32_t max_model_len;      /* the engine's context length */
    int32_t bos_token_id;       /* -1: none */
    int32_t eos_token_id;       /* -1: none */
    const char *architecture;   /* e.g. "llama"; valid until the engine is freed */
    const char *name;           /* the model's name; valid until the engine is freed */
    /* since 1.0; the pointers stay valid until the engine is freed */
    int64_t n_params;           /* parameters in the weights (elements of the GGUF's or
                                   the safetensors' tensors); -1: unknown (dummy load) */
    int32_t n_layers;           /* transformer blocks (GGUF <arch>.block_count, config.json
                                   num_hidden_layers); -1: unknown */
    int64_t kv_capacity_tokens; /* tokens the KV cache holds (its blocks x block_size) */
    const char *device;         /* where the engine runs: "cpu" or "cuda" */
    const char *dtype;          /* its compute dtype: "float32", "bfloat16", "float16" */
    const char *chat_template;  /* the chat template in use; NULL: none */
    const int32_t *eog_token_ids; /* the tokens that end generation (EOS and the model's
                                   generation_config stop tokens); NULL when none */
    size_t n_eog_token_ids;
    /* since 1.3; the pointers stay valid until the engine is freed */
    const char *quantization;   /* the weights' format, vLLM's quantization method:
                                   "fp8", "compressed-tensors" (the engine's
                                   params.quantization, else config.json's
                                   quantization_config.quant_method), "gguf:<type>"
                                   (the GGUF's general.file_type, e.g. "gguf:Q4_K_M");
                                   NULL: unquantized */
    const char *kv_cache_dtype; /* the KV cache's dtype: params.kv_cache_dtype ("fp8",
                                   "fp8_e4m3"), or with "auto" the model's dtype
                                   ("bfloat16", "float16", "float32") */
} vllm_model_info;

/* Per-request generation controls (vLLM's SamplingParams; same defaults and checks). */
typedef struct vllm_sampling_params {
    uint32_t struct_size;            /* sizeof(vllm_sampling_params), set by _init */
    int32_t max_tokens;              /* default 16; < 0: until the context is full */
    float temperature;               /* default 1.0; 0: greedy */
    float top_p;                     /* default 1.0 */
    int32_t top_k;                   /* default 0 (off) */
    float min_p;                     /* default 0.0 (off) */
    int64_t seed;                    /* per-request seed, used when has_seed != 0 */
    int32_t has_seed;                /* default 0 */
    int32_t ignore_eos;              /* default 0 */
    const int32_t *stop_token_ids;   /* extra stop tokens (copied); may be NULL when n is 0 */
    size_t n_stop_token_ids;
    int32_t skip_special_tokens;     /* default 1: leave special tokens out of the text */
    /* since 0.2 (n and logprobs: through vllm_openai_request) */
    float presence_penalty;          /* default 0.0, in [-2, 2] */
    float frequency_penalty;         /* default 0.0, in [-2, 2] */
    float repetition_penalty;        /* default 1.0, > 0 */
    int32_t min_tokens;              /* default 0: EOS and stop tokens blocked until reached */
    const char *const *stop;         /* stop strings (UTF-8, copied); may be NULL when n is 0 */
    size_t n_stop;
    int32_t include_stop_str_in_output;  /* default 0 */
    const int32_t *logit_bias_token_ids; /* logit_bias: n_logit_bias (token, bias) pairs */
    const float *logit_bias_values;      /* added to the logits, clamped to [-100, 100] */
    size_t n_logit_bias;
    const int32_t *allowed_token_ids;    /* NULL (default): any token; else only these */
    size_t n_allowed_token_ids;
    const char *const *bad_words;        /* words never generated (UTF-8, copied) */
    size_t n_bad_words;
    /* since 0.3: structured outputs (vLLM's StructuredOutputsParams). At most one of
     * these constraints may be set; an invalid one fails vllm_request_add /
     * vllm_request_submit with VLLM_ERR_INVALID_ARGUMENT and its reason. */
    const char *json_schema;             /* NULL: none; a JSON schema (JSON text) */
    int32_t json_object;                 /* 1: any JSON object; default 0 */
    const char *regex;                   /* NULL: none; the output matches this regex */
    const char *const *choice;           /* the output is exactly one of these strings */
    size_t n_choice;                     /* 0: no choice constraint */
    const char *grammar;                 /* NULL: none; EBNF / GBNF (llama.cpp) or Lark */
    const char *structural_tag;          /* NULL: none; an xgrammar structural tag (JSON) */
    /* since 1.0 */
    int32_t logprobs;                    /* -1 (default): none; 0: each generated token's
                                            logprob and rank; k > 0: also the top k
                                            (vllm_token_logprobs; vLLM's logprobs) */
    int32_t n;                           /* default 1: sequences per request; each output
                                            carries its sequence's index */
    /* since 1.2: vLLM's repetition_detection. The request ends (VLLM_FINISH_REPETITION)
     * once its output ends in an n-gram of repetition_min_pattern_size (0 means 1) to
     * repetition_max_pattern_size tokens repeated repetition_min_count times (checked
     * from min_tokens on). All 0 (default): off; max > 0 needs min_count >= 2. */
    int32_t repetition_max_pattern_size;
    int32_t repetition_min_pattern_size;
    int32_t repetition_min_count;
    /* since 1.2: vLLM's thinking_token_budget: once a reasoning block (the engine's
     * reasoning_start_str / reasoning_end_str, else its reasoning parser's markers) has
     * this many tokens, its end is forced, one token a step. -1 (default): unlimited;
     * set without markers the request is refused (VLLM_ERR_INVALID_ARGUMENT). */
    int32_t thinking_token_budget;
    /* since 1.2: vLLM's logprob_token_ids: each generated token's vllm_token_logprobs.top
     * holds these ids' logprobs (in this order; rank = the position) instead of the top
     * k; logprobs must then be -1 (it becomes their count) or their count; at most 128
     * ids, each in the vocabulary (copied; may be NULL when n is 0) */
    const int32_t *logprob_token_ids;
    size_t n_logprob_token_ids;
    /* since 1.3: 1 applies the model's generation_config.json defaults (temperature,
     * top_p, top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty,
     * max_new_tokens as max_tokens, skip_special_tokens) to each of these fields that
     * still holds its vllm_sampling_params_init value, as vLLM's OpenAI layer does for
     * request fields left unset (--generation-config auto: the request's value, else
     * the model's, else vLLM's). Default 0: vLLM's defaults only (as vLLM's LLM class
     * given SamplingParams). */
    int32_t use_generation_config;
} vllm_sampling_params;

/* One candidate for a generated token (since 1.0). */
typedef struct vllm_logprob {
    int32_t token_id;
    int32_t rank;               /* 1: the most likely token */
    float logprob;              /* log probability (of the processed logits, as vLLM) */
} vllm_logprob;

/* The logprobs of one generated token (since 1.0): vLLM's Logprob dict of a position. */
typedef struct vllm_token_logprobs {
    int32_t token_id;           /* the sampled token */
    int32_t rank;               /* its rank in the vocabulary (1: the most likely); when
                                   it is one of the logprob_token_ids (since 1.2), its
                                   position there (vLLM's Logprob dict keeps one entry
                                   a token) */
    float logprob;              /* its log probability */
    const vllm_logprob *top;    /* the sampling params' logprobs most likely tokens, rank
                                   1 first; with logprob_token_ids (since 1.2) those ids in
                                   their order, rank = position; NULL when n_top is 0 */
    size_t n_top;
} vllm_token_logprobs;

/* One request's progress in one step. Owned by the engine (see vllm_engine_step). */
typedef struct vllm_request_output {
    const char *request_id;
    const int32_t *token_ids;   /* tokens new this step; may be NULL when n_token_ids is 0 */
    size_t n_token_ids;
    const char *text;           /* text new this step, UTF-8 (may be "") */
    int32_t finished;           /* 1 on the request's last output, else 0 */
    int32_t finish_reason;      /* enum vllm_finish_reason */
    int32_t num_prompt_tokens;
    int32_t num_output_tokens;  /* cumulative, including this step */
    /* since 1.0 */
    vllm_status status;         /* VLLM_OK; with VLLM_FINISH_ERROR, why this request
                                   failed (e.g. VLLM_ERR_INVALID_ARGUMENT: its grammar) */
    const char *error;          /* "" unless status != VLLM_OK: the message */
    int32_t index;              /* the sequence, 0..n-1 (n of the sampling params); with
                                   n > 1 finish_reason is this sequence's, and finished
                                   = 1 comes once, on the request's last output */
    const vllm_token_logprobs *logprobs; /* one per token_ids entry; NULL unless the
                                   sampling params asked for logprobs (>= 0, or since 1.2
                                   logprob_token_ids) */
    double arrival_time;        /* Unix time in s when the request was added (vLLM's
                                   RequestStateStats.arrival_time) */
    double first_token_latency; /* s from arrival to the sequence's first token, 0
                                   before it (RequestStateStats.first_token_latency) */
    double e2e_latency;         /* s from arrival to the request's end, on its last
                                   output, else 0 (FinishedRequestStats.e2e_latency) */
} vllm_request_output;

/* A request streamed by the background loop (since 0.2). */
struct vllm_request;
typedef struct vllm_request vllm_request;

/* One step of a streamed request (since 0.2). Always passed by pointer and never in
 * arrays: the library may append fields; struct_size is the library's size. */
typedef struct vllm_event {
    uint32_t struct_size;
    int32_t finished;           /* 1 on the request's last event (exactly one), else 0 */
    const char *request_id;
    const int32_t *token_ids;   /* tokens new in this event; NULL when n_token_ids is 0 */
    size_t n_token_ids;
    const char *text;           /* text new in this event, UTF-8 (may be "") */
    int32_t finish_reason;      /* enum vllm_finish_reason */
    int32_t num_prompt_tokens;
    int32_t num_output_tokens;  /* cumulative, including this event */
    int32_t num_cached_tokens;  /* prompt tokens served from the prefix cache */
    vllm_status status;         /* VLLM_OK; on a last event with VLLM_FINISH_ERROR, why */
    const char *error;          /* "" unless status != VLLM_OK */
    /* since 1.0: as in vllm_request_output */
    int32_t index;
    const vllm_token_logprobs *logprobs;
    double arrival_time;
    double first_token_latency;
    double e2e_latency;
} vllm_event;

/* Receives the events of one request, in order, on the engine's loop thread. The event
 * and its pointers are valid during the call only. It may call libvllm functions
 * (vllm_request_cancel, vllm_request_submit, ...); while it runs the engine waits. */
typedef void (*vllm_event_callback)(const vllm_event *event, void *user_data);

/* The engine's counters and gauges, named after vLLM's Prometheus metrics (since 0.2). */
typedef struct vllm_metrics {
    uint32_t struct_size;             /* set by the caller to sizeof(vllm_metrics) */
    int32_t num_requests_running;     /* vllm:num_requests_running */
    int32_t num_requests_waiting;     /* vllm:num_requests_waiting */
    double kv_cache_usage_perc;       /* vllm:kv_cache_usage_perc, 0..1 */
    int64_t prefix_cache_queries;     /* vllm:prefix_cache_queries (tokens) */
    int64_t prefix_cache_hits;        /* vllm:prefix_cache_hits (tokens) */
    int64_t num_preemptions;          /* vllm:num_preemptions */
    int64_t prompt_tokens;            /* vllm:prompt_tokens */
    int64_t generation_tokens;        /* vllm:generation_tokens */
    int64_t request_success_stop;     /* vllm:request_success{finished_reason="stop"} */
    int64_t request_success_length;   /* ... "length" */
    int64_t request_success_abort;    /* ... "abort" */
    int64_t request_success_error;    /* ... "error" */
    int64_t request_success_repetition;  /* since 1.2: ... "repetition" */
} vllm_metrics;

/* A streamed OpenAI response (since 0.2). */
struct vllm_openai_stream;
typedef struct vllm_openai_stream vllm_openai_stream;

/* ------------------------------------------------------------------------- */
/* Version and errors (pure C: these never start the runtime)                 */
/* ------------------------------------------------------------------------- */

/* The library version "MAJOR.MINOR.PATCH" (since 1.3): MAJOR is the ABI major (the
 * SONAME's), MINOR the ABI minor, PATCH counts releases of that ABI; e.g. "1.3.0".
 * The Python package's engine.__version__, the same as pkg-config --modversion
 * libvllm. Its ABI as a number is vllm_abi_version(). Static string. */
VLLM_API const char *vllm_version(void);

/* The ABI version of the loaded library: (major << 16) | minor. Compare with
 * VLLM_ABI_VERSION: the majors must be equal, the library's minor >= yours. */
VLLM_API uint32_t vllm_abi_version(void);

/* A static English name of a status code, e.g. "VLLM_ERR_MODEL_LOAD". */
VLLM_API const char *vllm_status_string(vllm_status status);

/* The message of the last failed call on this thread, "" if none. Valid until the
 * next vllm_* call on this thread. */
VLLM_API const char *vllm_last_error(void);

/* Copies the last error of this thread into buf (truncated, always NUL-terminated
 * when size > 0) and returns its full length in bytes. For callers that may hop
 * threads between calls (Go) do the failing call and the copy in one locked region. */
VLLM_API size_t vllm_last_error_copy(char *buf, size_t size);

/* Routes the engine's log messages of level >= min_level to callback (NULL: back to
 * the default, warnings and errors on stderr). Pure C; takes effect at once, also
 * before the runtime starts. Since 0.2. */
VLLM_API void vllm_log_set(int32_t min_level, vllm_log_callback callback, void *user_data);

/* ------------------------------------------------------------------------- */
/* Lifecycle                                                                  */
/* ------------------------------------------------------------------------- */

/* Starts the runtime and imports the engine now (optional; otherwise the first
 * engine call does it). VLLM_ERR_RUNTIME_INIT if the runtime cannot start. */
VLLM_API vllm_status vllm_init(void);

/* Frees every engine and stops the library's threads and child processes. Call it
 * before the process exits. Safe to call twice; engines can be created again later. */
VLLM_API void vllm_shutdown(void);

/* ------------------------------------------------------------------------- */
/* Engine                                                                     */
/* ------------------------------------------------------------------------- */

/* Fills *params with the defaults (pure C): writes min(size, sizeof(vllm_engine_params))
 * bytes, struct_size included (set to that count), so a caller built against an
 * older, smaller struct passes its own sizeof and nothing past it is written. Call it
 * as vllm_engine_params_init(&p, sizeof p). size < 4 or params NULL: no-op. Since 1.0
 * (0.x had no size). */
VLLM_API void vllm_engine_params_init(vllm_engine_params *params, size_t size);

/* Loads the model at model_path and creates an engine. model_path: a GGUF file, a
 * directory holding exactly one .gguf file, or a Hugging Face model directory
 * (config.json and *.safetensors), as vLLM's --model.
 * params: NULL for the defaults. *out: the engine, NULL on failure.
 * VLLM_ERR_MODEL_LOAD: missing, unreadable or malformed model file.
 * VLLM_ERR_UNSUPPORTED: an architecture or quantization not implemented. */
VLLM_API vllm_status vllm_engine_create(const char *model_path,
                                        const vllm_engine_params *params,
                                        vllm_engine **out);

/* Frees the engine, its requests and everything it returned. NULL: no-op. */
VLLM_API void vllm_engine_free(vllm_engine *engine);

/* Fills *out (set out->struct_size first). The strings stay valid until the engine
 * is freed. */
VLLM_API vllm_status vllm_engine_model_info(vllm_engine *engine, vllm_model_info *out);

/* Whether the engine can still run (since 1.3; vLLM's EngineClient.check_health):
 * VLLM_OK while its background loop (if started) and its engine core (in process, or
 * the child process of params.multiprocessing) are alive; VLLM_ERR_ENGINE_DEAD with
 * the reason (vllm_last_error) once the loop failed or the child died (the engine's
 * other calls then fail too; vllm_engine_free still works). It never waits for a
 * running step: call it from any thread, e.g. a server's /health. */
VLLM_API vllm_status vllm_engine_check_health(vllm_engine *engine);

/* Drops the prefix cache: every cached KV block is forgotten, so later prompts are
 * computed again (vLLM's reset_prefix_cache, e.g. after the weights changed, or to
 * measure without cache hits). VLLM_OK: reset. VLLM_ERR_INVALID_STATE: not reset,
 * because running requests hold KV blocks (vLLM returns false); retry once they are
 * done. Works in both driving modes. Since 1.3. */
VLLM_API vllm_status vllm_engine_reset_prefix_cache(vllm_engine *engine);

/* The model's metadata key/values (since 1.0; as llama_model_meta_*): a GGUF's
 * key/values in file order, or the top-level keys of a Hugging Face directory's
 * config.json. vllm_model_meta_count sets *n to their number. */
VLLM_API vllm_status vllm_model_meta_count(vllm_engine *engine, size_t *n);

/* The key at index (0 .. count-1; else VLLM_ERR_INVALID_ARGUMENT) into buf. Two-call
 * sizing as vllm_detokenize: *n_bytes = its length without the NUL. Since 1.0. */
VLLM_API vllm_status vllm_model_meta_key(vllm_engine *engine, size_t index, char *buf,
                                         size_t capacity, size_t *n_bytes);

/* The value of key as text into buf (two-call sizing as vllm_model_meta_key): a string
 * as it is, a number in decimal, a bool "true" / "false", an array as JSON.
 * VLLM_ERR_NOT_FOUND: no such key. Since 1.0. */
VLLM_API vllm_status vllm_model_meta_value(vllm_engine *engine, const char *key, char *buf,
                                           size_t capacity, size_t *n_bytes);

/* ------------------------------------------------------------------------- */
/* Tokenizer                                                                  */
/* ------------------------------------------------------------------------- */

/* Tokenizes text_len bytes of UTF-8 text (no NUL needed; a NUL byte is text; text
 * may be NULL when text_len is 0; not UTF-8: VLLM_ERR_INVALID_ARGUMENT). Two-call
 * sizing: *n_tokens is always set to the number of tokens; if capacity < *n_tokens it
 * returns VLLM_ERR_BUFFER_TOO_SMALL and writes nothing (tokens may be NULL when
 * capacity is 0).
 * add_special: 1 to add the model's BOS etc. (as HF tokenizers), 0 not to.
 * parse_special: 1 to turn special-token text written in the input (e.g.
 * "<|im_start|>") into those control tokens, as for a rendered chat template; 0 to
 * tokenize it as plain text (user input: no prompt injection), as llama_tokenize's
 * parse_special. Since 1.0 (0.x: no text_len, always parse_special). */
VLLM_API vllm_status vllm_tokenize(vllm_engine *engine, const char *text, size_t text_len,
                                   int32_t add_special, int32_t parse_special,
                                   int32_t *tokens, size_t capacity, size_t *n_tokens);

/* Turns tokens back into text. Two-call sizing: *n_bytes is always set to the text's
 * length in bytes, without the NUL; buf needs capacity >= *n_bytes + 1, else
 * VLLM_ERR_BUFFER_TOO_SMALL (buf may be NULL when capacity is 0). */
VLLM_API vllm_status vllm_detokenize(vllm_engine *engine, const int32_t *tokens,
                                     size_t n_tokens, int32_t skip_special_tokens,
                                     char *buf, size_t capacity, size_t *n_bytes);

/* The bytes of one token, as llama_token_to_piece: byte-level pieces decoded to raw
 * bytes, which may be part of a UTF-8 sequence (concatenate pieces before printing).
 * special: 1 to spell special tokens (e.g. "<|im_end|>"), 0 to give "" for them.
 * Two-call sizing as vllm_detokenize (*n_bytes without the NUL; a piece may contain
 * a zero byte, so use *n_bytes). VLLM_ERR_INVALID_ARGUMENT: token outside the vocab.
 * Since 0.2. */
VLLM_API vllm_status vllm_token_to_piece(vllm_engine *engine, int32_t token, int32_t special,
                                         char *buf, size_t capacity, size_t *n_bytes);

/* ------------------------------------------------------------------------- */
/* Embeddings (since 1.3)                                                     */
/* ------------------------------------------------------------------------- */

/* Embeds n_inputs prompts with an engine created with runner "pooling" (vLLM's
 * LLM.embed): one vector per input, pooled and normalized as the engine's pooler
 * says (a converted decoder: the last token's hidden state, L2-normalized). The
 * inputs are either texts (texts[i] of text_lens[i] bytes of UTF-8, tokenized as a
 * prompt, special-token text parsed; text_lens NULL: each text is NUL-terminated)
 * or token ids (token_ids[i] of n_token_ids[i] ids): exactly one of texts and
 * token_ids is non-NULL. dimensions: 0 for the model's size; > 0 asks a matryoshka
 * truncation (VLLM_ERR_INVALID_ARGUMENT with vLLM's message on a model that is not
 * matryoshka, which a converted decoder is not).
 * Two-call sizing: *dim is always set to the vectors' size and *n_floats to
 * n_inputs * *dim; if capacity < *n_floats it returns VLLM_ERR_BUFFER_TOO_SMALL
 * without running the model (out may be NULL when capacity is 0); else out holds
 * the vectors one after the other, input order, row-major.
 * VLLM_ERR_UNSUPPORTED: the engine generates (runner "generate"). Blocks until the
 * batch ran; works in both driving modes (with the background loop the batch runs
 * beside other requests). */
VLLM_API vllm_status vllm_embed(vllm_engine *engine, const char *const *texts,
                                const size_t *text_lens, const int32_t *const *token_ids,
                                const size_t *n_token_ids, size_t n_inputs,
                                int32_t dimensions, float *out, size_t capacity,
                                size_t *n_floats, size_t *dim);

/* ------------------------------------------------------------------------- */
/* Chat template                                                              */
/* ------------------------------------------------------------------------- */

/* Renders a conversation with the model's chat template into a prompt string.
 * messages_json: an OpenAI-style JSON array, e.g.
 *   [{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]
 * add_generation_prompt: 1 to end with the assistant's turn header.
 * *out: a string the caller frees with vllm_string_free(); NULL on failure.
 * Tokenize the result with add_special_tokens = 0: the template adds them. */
VLLM_API vllm_status vllm_chat_template_apply(vllm_engine *engine, const char *messages_json,
                                              int32_t add_generation_prompt, char **out);

/* As vllm_chat_template_apply, with tool definitions: tools_json is an OpenAI-style
 * JSON array ([{"type":"function","function":{"name":...,"parameters":{...}}}]) passed
 * to the template as `tools`, or NULL. Since 0.2. */
VLLM_API vllm_status vllm_chat_template_render(vllm_engine *engine, const char *messages_json,
                                               const char *tools_json,
                                               int32_t add_generation_prompt, char **out);

/* Frees a string returned by the library. NULL: no-op. */
VLLM_API void vllm_string_free(char *str);

/* ------------------------------------------------------------------------- */
/* Requests                                                                   */
/* ------------------------------------------------------------------------- */

/* Fills *params with vLLM's defaults (pure C), writing min(size, sizeof) bytes as
 * vllm_engine_params_init: vllm_sampling_params_init(&sp, sizeof sp). Since 1.0. */
VLLM_API void vllm_sampling_params_init(vllm_sampling_params *params, size_t size);

/* Adds a request. Give exactly one of prompt (text, tokenized with special tokens)
 * or prompt_token_ids (n_prompt_token_ids > 0). params: NULL for the defaults.
 * request_id: unique among the engine's unfinished requests (copied).
 * VLLM_ERR_INVALID_ARGUMENT with vLLM's message for invalid sampling params. */
VLLM_API vllm_status vllm_request_add(vllm_engine *engine, const char *request_id,
                                      const char *prompt, const int32_t *prompt_token_ids,
                                      size_t n_prompt_token_ids,
                                      const vllm_sampling_params *params);

/* Aborts an unfinished request: its last output (finish_reason VLLM_FINISH_ABORT)
 * comes with the next vllm_engine_step (background loop: as its last event).
 * VLLM_ERR_NOT_FOUND if no such request is unfinished. */
VLLM_API vllm_status vllm_request_abort(vllm_engine *engine, const char *request_id);

/* Runs one engine step (schedule, forward, sample) and returns what the calling
 * thread's requests produced (those it added with vllm_request_add; other threads'
 * outputs wait for their own steps). *outputs is an array of *n_outputs entries owned
 * by the engine; it and every pointer in it stay valid until this thread's next
 * vllm_engine_step on this engine, or vllm_engine_free. With no unfinished request it
 * returns VLLM_OK and 0 outputs. Each request gets exactly one output with finished = 1.
 * VLLM_ERR_INVALID_STATE: this thread added no request and only other threads'
 * outputs are left (since 0.5). */
VLLM_API vllm_status vllm_engine_step(vllm_engine *engine,
                                      const vllm_request_output **outputs,
                                      size_t *n_outputs);

/* The number of requests whose last output (or last event) has not been delivered yet:
 * caller-driven, returned by vllm_engine_step to the thread that added it; pull mode,
 * taken by vllm_request_next (a freed request no longer counts); push mode, its last
 * callback has returned. */
VLLM_API vllm_status vllm_engine_num_unfinished(vllm_engine *engine, size_t *n);

/* Fills *out (set out->struct_size first; a smaller struct of an older header gets
 * its fields only). Works in both modes, from any thread. Since 0.2. */
VLLM_API vllm_status vllm_engine_metrics(vllm_engine *engine, vllm_metrics *out);

/* ------------------------------------------------------------------------- */
/* Background loop and streaming (since 0.2)                                  */
/* ------------------------------------------------------------------------- */

/* Starts the engine's loop thread: from now on it steps whenever a request is
 * unfinished and sleeps otherwise. vllm_engine_step and vllm_request_add then give
 * VLLM_ERR_INVALID_STATE; so does this call while requests added with
 * vllm_request_add are unfinished. Calling it twice is VLLM_OK. The loop ends with
 * vllm_engine_free (which aborts what is live). */
VLLM_API vllm_status vllm_engine_start_loop(vllm_engine *engine);

/* Adds a request to a looping engine (VLLM_ERR_INVALID_STATE otherwise). Prompt,
 * request_id and params as vllm_request_add; invalid input fails here, synchronously.
 * callback non-NULL: push mode, every event goes to callback(event, user_data) on the
 * loop thread, the last one (finished = 1) exactly once, also after a cancel or an
 * engine failure; user_data must stay valid until then. The first call may come before
 * vllm_request_submit returns. callback NULL: pull mode, take the events with
 * vllm_request_next.
 * out: the request's handle, freed with vllm_request_free; may be NULL in push mode. */
VLLM_API vllm_status vllm_request_submit(vllm_engine *engine, const char *request_id,
                                         const char *prompt, const int32_t *prompt_token_ids,
                                         size_t n_prompt_token_ids,
                                         const vllm_sampling_params *params,
                                         vllm_event_callback callback, void *user_data,
                                         vllm_request **out);

/* Pull mode: waits up to timeout_ms (< 0: no limit, 0: just look) for the request's
 * next event. *event is owned by the library and valid until the next call of
 * vllm_request_next or vllm_request_free on this request.
 * VLLM_OK: *event set (its finished = 1 on the last one; an engine failure comes as
 * a last event with finish_reason VLLM_FINISH_ERROR and its status and message).
 * VLLM_ERR_TIMEOUT: nothing yet. VLLM_END_OF_STREAM: the last event was returned.
 * VLLM_ERR_INVALID_STATE: the request is in push mode. */
VLLM_API vllm_status vllm_request_next(vllm_request *request, int32_t timeout_ms,
                                       const vllm_event **event);

/* Aborts the request: its last event (finish_reason VLLM_FINISH_ABORT) follows, unless
 * it has already finished. VLLM_OK either way. */
VLLM_API vllm_status vllm_request_cancel(vllm_request *request);

/* Releases the handle; an unfinished request is cancelled (a push callback still
 * gets its last event). NULL: no-op. */
VLLM_API void vllm_request_free(vllm_request *request);

/* ------------------------------------------------------------------------- */
/* OpenAI layer (since 0.2)                                                   */
/* ------------------------------------------------------------------------- */

/* Serves one OpenAI-compatible request on a looping engine (VLLM_ERR_INVALID_STATE
 * otherwise): method "GET" or "POST"; endpoint "/v1/completions",
 * "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize"; body the request
 * JSON (NULL: none). VLLM_OK whenever a response was made, also for an OpenAI error
 * (*http_status 4xx/5xx with an error body, as vLLM). Then exactly one of:
 *   *response_json: the response body, freed with vllm_string_free;
 *   *stream: a streamed response ("stream": true), read with vllm_openai_stream_next.
 * The model's name in requests and responses is params.served_model_name. */
VLLM_API vllm_status vllm_openai_request(vllm_engine *engine, const char *method,
                                         const char *endpoint, const char *body,
                                         int32_t *http_status, char **response_json,
                                         vllm_openai_stream **stream);

/* Flags of vllm_openai_request_len (since 0.5). */
typedef enum vllm_openai_flags {
    VLLM_OPENAI_DEFAULT = 0,
    /* A non-streamed generation (no "stream": true) also comes back as *stream, with
     * *http_status 0, so that vllm_openai_stream_cancel can abort it (a client that
     * disconnected): its one chunk is the complete response body, an OpenAI error body
     * {"error": {..., "code": <HTTP status>}} if it failed; then VLLM_END_OF_STREAM. */
    VLLM_OPENAI_DEFER_RESPONSE = 1
} vllm_openai_flags;

/* vllm_openai_request with the body given as body_size bytes (since 0.5): a NUL byte
 * is part of the body (so such a body is invalid JSON, a 400), and a body that is not
 * UTF-8 is a 400 as well. body may be NULL when body_size is 0. flags: 0 or
 * VLLM_OPENAI_DEFER_RESPONSE. */
VLLM_API vllm_status vllm_openai_request_len(vllm_engine *engine, const char *method,
                                             const char *endpoint, const char *body,
                                             size_t body_size, uint32_t flags,
                                             int32_t *http_status, char **response_json,
                                             vllm_openai_stream **stream);

/* Waits up to timeout_ms (< 0: no limit) for the next chunk: *chunk_json is one JSON
 * object, without SSE framing ("data: ...\n\n" is the caller's), freed with
 * vllm_string_free. VLLM_ERR_TIMEOUT: nothing yet. VLLM_END_OF_STREAM: the response
 * is complete (send "data: [DONE]"); later calls return it again. */
VLLM_API vllm_status vllm_openai_stream_next(vllm_openai_stream *stream, int32_t timeout_ms,
                                             char **chunk_json);

/* Stops the response's requests (e.g. the client disconnected). VLLM_OK. */
VLLM_API vllm_status vllm_openai_stream_cancel(vllm_openai_stream *stream);

/* Releases the stream, cancelling it if unfinished. NULL: no-op. */
VLLM_API void vllm_openai_stream_free(vllm_openai_stream *stream);

/* VLLM_API_END */

#ifdef __cplusplus
}
#endif

#endif /* VLLM_H */
