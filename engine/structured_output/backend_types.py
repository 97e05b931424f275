"""Backend interfaces: the constraint kinds, a per-request grammar, an engine-level backend.

Mirrors vllm/v1/structured_output/backend_types.py. A backend compiles a (kind, spec) into a
per-request `StructuredOutputGrammar` that owns the matcher state; bitmasks are int32 rows of
ceil(vocab/32) words, bit j of word i allowing token 32*i + j.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from libvllm.engine.structured_output.config import StructuredOutputsConfig
    from libvllm.engine.tokenizer import Tokenizer


class StructuredOutputOptions(enum.Enum):
    JSON = enum.auto()
    JSON_OBJECT = enum.auto()
    REGEX = enum.auto()
    GRAMMAR = enum.auto()
    CHOICE = enum.auto()
    STRUCTURAL_TAG = enum.auto()


StructuredOutputKey = tuple[StructuredOutputOptions, str]


class StructuredOutputGrammar(ABC):
    """Request-level matcher state."""

    @abstractmethod
    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Advance over `tokens`; False if one is rejected (state stops before it)."""

    @abstractmethod
    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """The longest accepted prefix of `tokens`, without advancing."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
        """Write the allowed next tokens into row `batch_index` of `bitmask`."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether the grammar has accepted a stop token (the output is complete)."""


@dataclass
class StructuredOutputBackend(ABC):
    """Engine-level backend: one per engine, built on the first structured request."""

    config: StructuredOutputsConfig
    tokenizer: Tokenizer
    vocab_size: int

    @abstractmethod
    def compile_grammar(
        self,
        request_type: StructuredOutputOptions,
        grammar_spec: str,
        stop_token_ids: set[int] | None = None,
    ) -> StructuredOutputGrammar:
        """Compile (or reuse a compiled) grammar and return a fresh matcher over it."""

    @abstractmethod
    def destroy(self) -> None:
        """Release backend resources."""
