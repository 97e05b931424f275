"""Reasoning parsers, selected by vLLM's `--reasoning-parser` names.

Mirrors vllm/reasoning/__init__.py (`_REASONING_PARSERS_TO_REGISTER`, vLLM 0.33) for the
parsers we ship.
"""

from libvllm.engine.reasoning.abs_reasoning_parsers import ReasoningParser, ReasoningParserManager

__all__ = ["ReasoningParser", "ReasoningParserManager"]

_REASONING_PARSERS_TO_REGISTER = {
    "deepseek_r1": ("deepseek_r1_reasoning_parser", "DeepSeekR1ReasoningParser"),
    "qwen3": ("qwen3_reasoning_parser", "Qwen3ReasoningParser"),
}

for _name, (_file, _cls) in _REASONING_PARSERS_TO_REGISTER.items():
    ReasoningParserManager.register_lazy_module(_name, f"libvllm.engine.reasoning.{_file}", _cls)
