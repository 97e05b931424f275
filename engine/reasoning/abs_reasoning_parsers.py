"""ReasoningParser base class and the `--reasoning-parser` registry.

Mirrors vllm/reasoning/abs_reasoning_parsers.py (vLLM 0.33): the split of a finished output
into (reasoning, content), the per-delta split for streaming, and the token-id checks the
structured-output gate uses (`is_reasoning_end`, `is_reasoning_end_streaming`,
`extract_content_ids`). `find_reasoning_end` / `implicit_end_token_ids` are the small part
of upstream's engine adapters (`ParserEngineReasoningAdapter.find_reasoning_end`) the
gate needs. One instance per request.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from functools import cached_property
from typing import Any

from libvllm.engine.tool_parsers.protocol import DeltaMessage


class ReasoningParser:
    # Tokens that end reasoning and are themselves the first content token (qwen3's
    # <tool_call>); the gate keeps them masked while the grammar could not start with them.
    implicit_end_token_ids: tuple[int, ...] = ()

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        self.model_tokenizer = tokenizer

    @cached_property
    def vocab(self) -> dict[str, int]:
        return self.model_tokenizer.backend.get_vocab(with_added_tokens=True)

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        raise NotImplementedError

    def is_reasoning_end_streaming(
        self, input_ids: Sequence[int], delta_ids: Iterable[int]
    ) -> bool:
        return self.is_reasoning_end(input_ids)

    def find_reasoning_end(self, delta_ids: Sequence[int]) -> tuple[int, bool] | None:
        """(offset in delta_ids where reasoning ends, whether that token is content) or None."""
        raise NotImplementedError

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """Generated tokens that are reasoning (usage.completion_tokens_details); 0 when
        the parser cannot tell, as upstream's default."""
        return 0

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        raise NotImplementedError

    def extract_reasoning(
        self, model_output: str, request: Any = None
    ) -> tuple[str | None, str | None]:
        raise NotImplementedError

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        raise NotImplementedError


class ReasoningParserManager:
    """`--reasoning-parser` name -> ReasoningParser class, imported lazily."""

    reasoning_parsers: dict[str, type[ReasoningParser]] = {}
    lazy_parsers: dict[str, tuple[str, str]] = {}

    @classmethod
    def register_lazy_module(cls, name: str, module_path: str, class_name: str) -> None:
        cls.lazy_parsers[name] = (module_path, class_name)

    @classmethod
    def get_reasoning_parser(cls, name: str) -> type[ReasoningParser]:
        if name in cls.reasoning_parsers:
            return cls.reasoning_parsers[name]
        if name not in cls.lazy_parsers:
            registered = ", ".join(cls.list_registered())
            raise KeyError(f"Reasoning parser '{name}' not found. Available parsers: {registered}")
        module_path, class_name = cls.lazy_parsers[name]
        parser_cls = getattr(importlib.import_module(module_path), class_name)
        cls.reasoning_parsers[name] = parser_cls
        return parser_cls

    @classmethod
    def list_registered(cls) -> list[str]:
        return sorted(set(cls.reasoning_parsers) | set(cls.lazy_parsers))
