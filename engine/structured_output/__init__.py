"""StructuredOutputManager: the engine-level owner of structured outputs.

Mirrors vllm/v1/structured_output/__init__.py (vLLM 0.33) without speculative decoding:
backends built on first use, grammar compilation on a thread pool (off the engine loop)
with a deadline, the per-step bitmask of a batch, advancing the matchers after sampling,
and the reasoning gate (no constraint until reasoning ends). Upstream's one-backend-per-
engine limitation (its FIXME) is lifted: xgrammar and guidance requests share a batch, both
bitmasks having the same packed layout.

Per step (see .agents/specs/structured-output.md):
    bitmask = manager.grammar_bitmask(so_requests)        # int32 [n, ceil(V/32)], CPU
    apply_grammar_bitmask(logits, bitmask, rows)          # before sampling (utils.py)
    ok = manager.accept_tokens(so_request, [token_id])    # after sampling

The package imports no torch (the front end reaches params.py through it:
.agents/specs/torch-free-front-end.md); the bitmask does, when first built.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from libvllm.engine.errors import InvalidArgumentError, VllmError
from libvllm.engine.structured_output.backend_types import StructuredOutputBackend
from libvllm.engine.structured_output.config import StructuredOutputsConfig
from libvllm.engine.structured_output.params import StructuredOutputsParams
from libvllm.engine.structured_output.request import StructuredOutputRequest

if TYPE_CHECKING:
    import torch

    from libvllm.engine.reasoning import ReasoningParser

__all__ = [
    "StructuredOutputManager",
    "StructuredOutputRequest",
    "StructuredOutputsConfig",
    "StructuredOutputsParams",
]


def _backend_class(name: str) -> type[StructuredOutputBackend]:
    """Imported on first use: xgrammar / llguidance take seconds to import."""
    if name == "guidance":
        from libvllm.engine.structured_output.backend_guidance import GuidanceBackend

        return GuidanceBackend
    from libvllm.engine.structured_output.backend_xgrammar import XgrammarBackend

    return XgrammarBackend


class StructuredOutputManager:
    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        config: StructuredOutputsConfig | None = None,
        reasoner_cls: type[ReasoningParser] | None = None,
    ) -> None:
        """tokenizer: engine.tokenizer.Tokenizer; vocab_size: the logits width;
        reasoner_cls: a ReasoningParser class (engine.reasoning) or None."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.config = config or StructuredOutputsConfig()
        self.reasoner_cls = reasoner_cls
        self.backends: dict[str, StructuredOutputBackend] = {}
        self._max_workers = max(2, (multiprocessing.cpu_count() + 1) // 2)
        self.executor = ThreadPoolExecutor(self._max_workers, "structured-output")

    def validate(self, params: StructuredOutputsParams) -> StructuredOutputsParams:
        """Check a request's constraint and resolve its backend (InvalidArgumentError)."""
        from libvllm.engine.structured_output.validation import validate_structured_outputs

        return validate_structured_outputs(params, self.config)

    def grammar_init(self, request: StructuredOutputRequest) -> None:
        """Start compiling the request's grammar; poll `request.is_grammar_ready`."""
        if request.params._backend is None:
            self.validate(request.params)
        name = request.params._backend
        if name not in self.backends:  # built on first use, kept for the engine's life
            backend_cls = _backend_class(name)
            self.backends[name] = backend_cls(self.config, self.tokenizer, self.vocab_size)
        timeout = self.config.grammar_compilation_timeout_s
        request.compile_timeout_s = timeout
        request.deadline = time.monotonic() + timeout if timeout else None
        request.on_timeout = self._replace_executor
        request.grammar = self.executor.submit(self._create_grammar, request, name)

    def _create_grammar(self, request: StructuredOutputRequest, backend: str):
        kind, spec = request.structured_output_key
        try:
            return self.backends[backend].compile_grammar(
                kind, spec, stop_token_ids=request.stop_token_ids
            )
        except VllmError:
            raise
        except Exception as e:  # validated but does not compile: fails this request only
            msg = f"Failed to compile the structured output grammar: {e}"
            raise InvalidArgumentError(msg) from e

    def _replace_executor(self) -> None:
        """A compile overran its deadline: new work gets fresh threads (it cannot be killed)."""
        old, self.executor = self.executor, ThreadPoolExecutor(self._max_workers)
        old.shutdown(wait=False)

    def _get_reasoner(self, request: StructuredOutputRequest):
        if request.reasoner is None:
            kwargs = request.reasoning_parser_kwargs or {}
            request.reasoner = self.reasoner_cls(self.tokenizer, **kwargs)
        return request.reasoner

    def should_constrain(self, request: StructuredOutputRequest) -> bool:
        """False while the request is still reasoning (its rows stay unconstrained)."""
        if self.config.enable_in_reasoning or self.reasoner_cls is None:
            return True
        if request.reasoning_ended is None:
            ended = self._get_reasoner(request).is_reasoning_end(request.prompt_token_ids or [])
            request.reasoning_ended = ended
        return request.reasoning_ended

    def grammar_bitmask(self, requests: list[StructuredOutputRequest]) -> torch.Tensor:
        """One int32 row per request (grammars must be ready): allowed next tokens."""
        import torch

        words = (self.vocab_size + 31) // 32
        bitmask = torch.full((len(requests), words), -1, dtype=torch.int32)
        for row, request in enumerate(requests):
            grammar = request.grammar
            if grammar is None or isinstance(grammar, Exception):  # the caller checks readiness
                raise VllmError(f"request {request.request_id!r} has no ready grammar")
            if not self.should_constrain(request):
                self._fill_reasoning_row(request, grammar, bitmask[row])
            elif not grammar.is_terminated():
                grammar.fill_bitmask(bitmask, row)
        return bitmask

    def _fill_reasoning_row(self, request, grammar, row: torch.Tensor) -> None:
        """Everything except implicit reasoning ends the grammar could not start with."""
        for token_id in getattr(self._get_reasoner(request), "implicit_end_token_ids", ()):
            if not grammar.validate_tokens([token_id]):
                clear = ~(1 << (token_id & 31))
                row[token_id >> 5] &= clear + (1 << 32) if clear < -(1 << 31) else clear

    def accept_tokens(self, request: StructuredOutputRequest, new_token_ids: list[int]) -> bool:
        """Advance the request's matcher; False when the grammar rejects a token."""
        if not new_token_ids:
            return True
        if not self.should_constrain(request):
            end = self._get_reasoner(request).find_reasoning_end(new_token_ids)
            if end is None:
                return True
            offset, implicit = end
            request.reasoning_ended = True
            new_token_ids = new_token_ids[offset if implicit else offset + 1 :]
        return request.grammar.accept_tokens(request.request_id, new_token_ids)

    def clear_backend(self) -> None:
        """Engine shutdown: drop queued compiles (a running one finishes on its own)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        for backend in self.backends.values():
            backend.destroy()
        self.backends.clear()
