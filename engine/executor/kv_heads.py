"""This rank's share of the KV cache under tensor parallelism, as vLLM's
ModelConfig.get_num_kv_heads: kv heads split by rank, or one per rank (replicated) when
there are fewer kv heads than ranks. Also the architectures whose layers are TP-aware.
"""

from __future__ import annotations

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.models.config import ModelArchConfig

# architectures built only from engine/layers' parallel layers (attention + MLP / MoE)
TP_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Gemma3ForCausalLM",
})


def num_kv_heads_per_rank(arch: ModelArchConfig, tp: int) -> int:
    return max(1, arch.num_key_value_heads // tp)


def kv_cache_shape(arch: ModelArchConfig, num_blocks: int, block_size: int,
                   tp: int) -> tuple[int, ...]:
    """[2, num_blocks, block_size, kv heads of this rank, head_dim]."""
    return (2, num_blocks, block_size, num_kv_heads_per_rank(arch, tp), arch.head_dim)


def verify_tensor_parallel(arch: ModelArchConfig, tp: int) -> None:
    """InvalidArgumentError unless `arch` can run on `tp` ranks."""
    if tp == 1:
        return
    if arch.architectures[0] not in TP_ARCHITECTURES:
        raise InvalidArgumentError(f"tensor_parallel_size {tp}: {arch.architectures[0]} has no "
                                   f"tensor-parallel layers yet (supported: "
                                   f"{', '.join(sorted(TP_ARCHITECTURES))})")
    for name, n in (("num_attention_heads", arch.num_attention_heads),
                    ("intermediate_size", arch.intermediate_size)):
        if n % tp:
            raise InvalidArgumentError(f"{name} {n} is not divisible by "
                                       f"tensor_parallel_size {tp}")
    kv = arch.num_key_value_heads
    if kv % tp and tp % kv:
        raise InvalidArgumentError(f"num_key_value_heads {kv} and tensor_parallel_size {tp}: "
                                   f"one must divide the other")
