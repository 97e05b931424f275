"""Tool-call parsers, selected by vLLM's `--tool-call-parser` names.

Mirrors vllm/tool_parsers/__init__.py (`_TOOL_PARSERS_TO_REGISTER`, vLLM 0.33) for the
parsers we ship; names are user-facing, keep them as upstream spells them.
"""

from libvllm.engine.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager

__all__ = ["ToolParser", "ToolParserManager"]

_TOOL_PARSERS_TO_REGISTER = {
    "hermes": ("hermes_tool_parser", "Hermes2ProToolParser"),
    "qwen3_json": ("hermes_tool_parser", "Hermes2ProToolParser"),
    "llama3_json": ("llama_tool_parser", "Llama3JsonToolParser"),
    "llama4_json": ("llama_tool_parser", "Llama3JsonToolParser"),
    "mistral": ("mistral_tool_parser", "MistralToolParser"),
    "pythonic": ("pythonic_tool_parser", "PythonicToolParser"),
    "qwen3_coder": ("qwen3_tool_parser", "Qwen3XMLToolParser"),
    "qwen3_xml": ("qwen3_tool_parser", "Qwen3XMLToolParser"),
}

for _name, (_file, _cls) in _TOOL_PARSERS_TO_REGISTER.items():
    ToolParserManager.register_lazy_module(_name, f"libvllm.engine.tool_parsers.{_file}", _cls)
