"""The llguidance backend (`auto`'s fallback): LLTokenizer from our tokenizer, grammar
serialization per constraint kind, request matchers, and guidance request validation.

Mirrors vllm/v1/structured_output/backend_guidance.py (vLLM 0.33, llguidance 1.7):
`serialize_guidance_grammar`, `validate_guidance_grammar`,
`has_guidance_unsupported_json_features`, `process_for_additional_properties`, and
`GuidanceGrammar`'s EOS/rollback bookkeeping.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass

import llguidance
import torch

from libvllm.engine import envs
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.structured_output.backend_types import (
    StructuredOutputBackend,
    StructuredOutputGrammar,
    StructuredOutputOptions,
)
from libvllm.engine.structured_output.params import StructuredOutputsParams
from libvllm.engine.structured_output.request import get_structured_output_key
from libvllm.engine.structured_output.utils import CompiledGrammarCache

logger = logging.getLogger(__name__)
_O = StructuredOutputOptions
_SCHEMA_MAPS = (
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
)
_SUBSCHEMAS = (
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "contains",
    "additionalItems",
    "unevaluatedItems",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
    "items",
    "prefixItems",
    "allOf",
    "anyOf",
    "oneOf",
)


def _close_additional_properties(data: object) -> None:
    if isinstance(data, list):
        for item in data:
            _close_additional_properties(item)
        return
    if not isinstance(data, dict):
        return
    for key in _SCHEMA_MAPS:
        if isinstance(data.get(key), dict):
            for sub in data[key].values():
                _close_additional_properties(sub)
    for key in _SUBSCHEMAS:
        if isinstance(data.get(key), (dict, list)):
            _close_additional_properties(data[key])
    if "additionalProperties" not in data and (
        isinstance(data.get("properties"), dict) or isinstance(data.get("patternProperties"), dict)
    ):
        data["additionalProperties"] = False


def process_for_additional_properties(schema: str | dict) -> dict:
    """A copy of the schema with additionalProperties: false wherever it is unset."""
    obj = json.loads(schema) if isinstance(schema, str) else copy.deepcopy(schema)
    _close_additional_properties(obj)
    return obj


def has_guidance_unsupported_json_features(schema: dict) -> bool:
    """patternProperties anywhere (llguidance rejects it)."""
    stack: list[object] = [schema]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            if "patternProperties" in obj:
                return True
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
    return False


def serialize_guidance_grammar(
    request_type: StructuredOutputOptions,
    grammar_spec: str | dict,
    disable_any_whitespace: bool = False,
    disable_additional_properties: bool = False,
) -> str:
    defaults = {"whitespace_flexible": not disable_any_whitespace}

    def schema_grammar(spec: str | dict) -> str:
        if disable_additional_properties:
            spec = process_for_additional_properties(spec)
        return llguidance.LLMatcher.grammar_from_json_schema(spec, defaults=defaults)

    if request_type == _O.JSON:
        return schema_grammar(grammar_spec)
    if request_type == _O.JSON_OBJECT:
        return schema_grammar('{"type": "object"}')
    if request_type == _O.STRUCTURAL_TAG:
        s_tag = json.loads(grammar_spec) if isinstance(grammar_spec, str) else grammar_spec
        triggers: list[str] = s_tag["triggers"]
        tags = []
        for s in s_tag["structures"]:
            trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
            if trigger is None:
                raise InvalidArgumentError(f"Trigger {s['begin']} not found in triggers {triggers}")
            tags.append(
                llguidance.StructTag(
                    trigger=trigger,
                    begin=s["begin"],
                    grammar=schema_grammar(s["schema"]),
                    end=s["end"],
                )
            )
        if not tags:
            raise InvalidArgumentError("No structural tags found in the grammar spec.")
        return llguidance.StructTag.to_grammar(tags)
    kinds = {_O.REGEX: "regex", _O.GRAMMAR: "grammar", _O.CHOICE: "choice"}
    if request_type not in kinds:
        raise InvalidArgumentError(f"grammar is not of valid supported types. ({request_type!s})")
    return llguidance.grammar_from(kinds[request_type], grammar_spec)


def validate_guidance_grammar(params: StructuredOutputsParams) -> None:
    """Raise InvalidArgumentError unless llguidance accepts the constraint."""
    kind, spec = get_structured_output_key(params)
    try:
        grammar = serialize_guidance_grammar(kind, spec)
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidArgumentError(f"Invalid grammar specification: {e}") from e
    err = llguidance.LLMatcher.validate_grammar(grammar, None)
    if err:
        raise InvalidArgumentError(f"Grammar error: {err}")


@dataclass
class GuidanceBackend(StructuredOutputBackend):
    def __post_init__(self) -> None:
        self.ll_tokenizer = llguidance.LLTokenizer(
            self.tokenizer.backend.to_str(),
            n_vocab=self.vocab_size,
            eos_token=self.tokenizer.eos_token_id,
        )
        self.cache = CompiledGrammarCache(self.config.compiled_cache_size,
                                          self.config.compiled_cache_mb << 20, _text_bytes)

    def _serialize(self, request_type: StructuredOutputOptions, spec: str) -> str:
        return serialize_guidance_grammar(
            request_type,
            spec,
            self.config.disable_any_whitespace,
            self.config.disable_additional_properties,
        )

    def compile_grammar(
        self,
        request_type: StructuredOutputOptions,
        grammar_spec: str,
        stop_token_ids: set[int] | None = None,
    ) -> StructuredOutputGrammar:
        grammar = self.cache.get_or_compile(
            (request_type, grammar_spec), lambda: self._serialize(request_type, grammar_spec)
        )
        log_level = envs.LLGUIDANCE_LOG_LEVEL
        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=log_level)
        if err := matcher.get_error():
            raise InvalidArgumentError(f"Grammar error: {err}")
        return GuidanceGrammar(matcher, self.ll_tokenizer.eos_token)

    def destroy(self) -> None:
        pass


class GuidanceGrammar(StructuredOutputGrammar):
    def __init__(self, matcher: llguidance.LLMatcher, eos_token: int) -> None:
        self.ll_matcher = matcher
        self.eos_token = eos_token
        self.terminated = False
        self.rollback_lag = 0
        self.printed_error = False

    def check_error(self) -> None:
        if not self.printed_error and (err := self.ll_matcher.get_error()):
            self.printed_error = True
            logger.warning("LLMatcher error: %s", err)

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        if self.eos_token in tokens:
            if self.ll_matcher.is_stopped() and not self.terminated:
                self.rollback_lag = 1
            self.terminated = True
        if self.ll_matcher.is_stopped():
            return True
        accepted = self.ll_matcher.consume_tokens(tokens)
        self.check_error()
        return accepted

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        if not tokens or self.ll_matcher.is_stopped():
            return []
        num = self.ll_matcher.validate_tokens(tokens)
        self.check_error()
        return tokens[:num]

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self.ll_matcher.rollback(num_tokens - self.rollback_lag)
            self.terminated = False
            self.rollback_lag = 0
            self.check_error()

    def fill_bitmask(self, bitmask: torch.Tensor, idx: int) -> None:
        # A stopped or failed matcher yields the EOS-only mask. bitmask [rows, vocab / 32]
        # int32 on the CPU; llguidance writes row idx in place, as llguidance.torch's
        # fill_next_token_bitmask has it do (that module is not imported: its torch.compile
        # decorator loads torch._dynamo and torch._inductor, ~6 s of CPU at the first request)
        row = bitmask[idx]
        assert bitmask.dtype == torch.int32 and row.is_cpu and row.is_contiguous()
        self.ll_matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
        self.check_error()

    def is_terminated(self) -> bool:
        return self.terminated


def _text_bytes(value: object) -> int:
    """The cache's size of a serialized grammar or of a (kind, spec) key."""
    return sum(len(v) for v in value if isinstance(v, str)) if isinstance(value, tuple) \
        else len(value)
