"""Engine-level structured-output settings.

Mirrors vllm/config/structured_outputs.py (`StructuredOutputsConfig`: backend, whitespace,
additionalProperties, reasoning parser, enable_in_reasoning) and the two vllm/envs.py knobs
the backends read (`VLLM_REGEX_COMPILATION_TIMEOUT_S`, `VLLM_XGRAMMAR_CACHE_MB`).
`grammar_compilation_timeout_s`, `compiled_cache_size` and `compiled_cache_mb` are libvllm
additions: vLLM has no limit on a whole grammar compile and caches only inside xgrammar
(as the xgrammar backend here); the guidance backend's LRU is bounded in entries and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libvllm.engine import envs
from libvllm.engine.errors import InvalidArgumentError, UnsupportedError

BACKENDS = ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")
SHIPPED_BACKENDS = ("auto", "xgrammar", "guidance")


@dataclass
class StructuredOutputsConfig:
    backend: str = "auto"
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    reasoning_parser: str = ""
    enable_in_reasoning: bool = False
    grammar_compilation_timeout_s: float = 30.0
    compiled_cache_size: int = 256
    compiled_cache_mb: int = 64  # the serialized guidance grammars the LRU may keep
    regex_compilation_timeout_s: int = field(
        default_factory=lambda: envs.VLLM_REGEX_COMPILATION_TIMEOUT_S)
    xgrammar_cache_mb: int = field(default_factory=lambda: envs.VLLM_XGRAMMAR_CACHE_MB)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise InvalidArgumentError(
                f"structured outputs backend must be one of {BACKENDS}, got {self.backend!r}"
            )
        if self.backend not in SHIPPED_BACKENDS:
            raise UnsupportedError(
                f"the {self.backend!r} structured outputs backend is not available; "
                "use 'auto', 'xgrammar' or 'guidance'"
            )
        if self.disable_any_whitespace and self.backend not in ("xgrammar", "guidance"):
            raise InvalidArgumentError(
                "disable_any_whitespace is only supported for xgrammar and guidance backends."
            )
        if self.disable_additional_properties and self.backend != "guidance":
            raise InvalidArgumentError(
                "disable_additional_properties is only supported for the guidance backend."
            )
        if not self.grammar_compilation_timeout_s >= 0:
            raise InvalidArgumentError("grammar_compilation_timeout_s must be >= 0")
        if self.compiled_cache_size < 0:
            raise InvalidArgumentError("compiled_cache_size must be >= 0")
        if self.compiled_cache_mb < 0:
            raise InvalidArgumentError("compiled_cache_mb must be >= 0")
