"""Per-request structured-output state: the constraint, its grammar (a compile future until
ready), the compile deadline, and the reasoning gate.

Mirrors vllm/v1/structured_output/request.py (`StructuredOutputRequest`,
`get_structured_output_key`). The deadline is ours: a compile still running past it turns
into an InvalidArgumentError for this request only.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.structured_output.backend_types import (
    StructuredOutputGrammar,
    StructuredOutputKey,
    StructuredOutputOptions,
)
from libvllm.engine.structured_output.params import StructuredOutputsParams


@dataclasses.dataclass
class StructuredOutputRequest:
    params: StructuredOutputsParams
    request_id: str = ""
    # The request's EOS + stop_token_ids: masked until the grammar terminates.
    stop_token_ids: set[int] | None = None
    prompt_token_ids: list[int] | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    _grammar: Future | StructuredOutputGrammar | Exception | None = None
    compile_timeout_s: float = 0.0  # 0: no limit; else set with `deadline` by the manager
    deadline: float | None = None  # time.monotonic() after which a pending compile fails
    on_timeout: Callable[[], None] | None = None
    reasoning_ended: bool | None = None
    reasoner: Any = None  # a ReasoningParser, built per request on first use

    def _check_grammar_completion(self) -> bool:
        if isinstance(self._grammar, Future):
            if not self._grammar.done():
                if self.deadline is None or time.monotonic() < self.deadline:
                    return False
                self._grammar.cancel()
                self._grammar = InvalidArgumentError(
                    f"Grammar compilation timed out after {self.compile_timeout_s}s; the "
                    "structured output constraint may be too complex"
                )
                if self.on_timeout is not None:
                    self.on_timeout()
                return True
            try:
                self._grammar = self._grammar.result()
            except Exception as e:  # the compile's error fails only this request
                self._grammar = e
        return True

    @property
    def is_grammar_ready(self) -> bool:
        return self._check_grammar_completion()

    @property
    def grammar(self) -> StructuredOutputGrammar | Exception | None:
        if not self._check_grammar_completion():
            return None
        return self._grammar  # type: ignore[return-value]

    @grammar.setter
    def grammar(self, grammar: StructuredOutputGrammar | Future) -> None:
        self._grammar = grammar

    def wait_grammar(self, timeout: float | None = None) -> StructuredOutputGrammar:
        """Block until compiled (tests and offline callers); raise the compile's error."""
        if isinstance(self._grammar, Future):
            limit = timeout if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            wait([self._grammar], timeout=limit)
            if not self._grammar.done() and self.deadline is not None:
                self.deadline = time.monotonic()  # waited the whole limit: expire it now
        grammar = self.grammar
        if grammar is None:
            raise InvalidArgumentError("grammar is not compiled yet")
        if isinstance(grammar, Exception):
            raise grammar
        return grammar

    @functools.cached_property
    def structured_output_key(self) -> StructuredOutputKey:
        return get_structured_output_key(self.params)


def get_structured_output_key(params: StructuredOutputsParams) -> StructuredOutputKey:
    if params.json is not None:
        spec = params.json if isinstance(params.json, str) else json.dumps(params.json)
        return StructuredOutputOptions.JSON, spec
    if params.json_object:
        return StructuredOutputOptions.JSON_OBJECT, ""
    if params.regex is not None:
        return StructuredOutputOptions.REGEX, params.regex
    if params.choice is not None:
        return StructuredOutputOptions.CHOICE, json.dumps(params.choice)
    if params.grammar is not None:
        return StructuredOutputOptions.GRAMMAR, params.grammar
    if params.structural_tag is not None:
        return StructuredOutputOptions.STRUCTURAL_TAG, params.structural_tag
    raise InvalidArgumentError("No valid structured output parameter found")
