"""What vllm_model_info.quantization and .kv_cache_dtype report (since ABI 1.3), from
the engine's config and the model metadata engine/session/model_meta.py gives (a GGUF's
key/values as the core's ready message carried them, or config.json).

quantization mirrors vLLM's ModelConfig.quantization (vllm/config/model.py
_verify_quantization): the --quantization the engine was given, else the checkpoint's
config.json quantization_config.quant_method. A GGUF file reports "gguf:<type>", its
general.file_type named as llama.cpp's llama_ftype (include/llama.h, LLAMA_FTYPE_MOSTLY_*
without the prefix). kv_cache_dtype mirrors CacheConfig.cache_dtype: the configured one,
"auto" resolved to the model's dtype.
"""

from __future__ import annotations

# llama.cpp include/llama.h enum llama_ftype (ids 4-6 were removed from ggml)
GGUF_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE",
}


def quantization(configured: str | None, kv: dict, is_gguf: bool) -> str | None:
    """The quantization method of the weights; None: unquantized."""
    if is_gguf:
        file_type = kv.get("general.file_type")
        name = GGUF_FILE_TYPES.get(file_type) if isinstance(file_type, int) else None
        return f"gguf:{name}" if name else "gguf"
    if configured:
        return configured
    config = kv.get("quantization_config")
    method = config.get("quant_method") if isinstance(config, dict) else None
    return method if isinstance(method, str) and method else None


def kv_cache_dtype(configured: str, model_dtype: str) -> str:
    """The KV cache's dtype: the configured one, "auto" being the model's dtype."""
    return model_dtype if configured == "auto" else configured
