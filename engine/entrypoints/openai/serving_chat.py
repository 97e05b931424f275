"""POST /v1/chat/completions: messages -> chat template -> engine -> response or chunks.

Mirrors vllm/entrypoints/openai/chat_completion/serving.py (create_chat_completion,
chat_completion_stream_generator: a role chunk per choice, content deltas, a finish chunk
per choice, the include_usage chunk; chat_completion_full_generator) and
ChatCompletionRequest.to_sampling_params (max_tokens None fills the context; response_format
and structured_outputs -> the grammar). Tools are rendered by the chat template; reasoning
and tool calls are split from each choice by engine/entrypoints/openai/chat_parser.py
(tool_choice constrained as vLLM's adjust_request: structural tags of the parser's syntax,
or the JSON schema of required / named).
use_beam_search: the prompt's beams are the choices (engine/entrypoints/openai/serving_beam.py).
No engine lock is taken here: the parsers are per choice and the tokenizer is read-only,
and chunks are made on the caller's thread (a stream look with timeout 0, which the HTTP
server makes on its event loop, must never wait for an engine step).
"""

from __future__ import annotations

import time

from libvllm.engine.entrypoints.openai.accumulate import StreamClock, collect, include_usage
from libvllm.engine.entrypoints.openai.chat_parser import (
    ChatParser,
    check_tool_choice,
    resolve_finish_reason,
)
from libvllm.engine.entrypoints.openai.chat_protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
)
from libvllm.engine.entrypoints.openai.chat_render import chat_template_kwargs, render_prompt
from libvllm.engine.entrypoints.openai.logprobs import chat_logprobs
from libvllm.engine.entrypoints.openai.prompt_limits import encode_prompt
from libvllm.engine.entrypoints.openai.protocol import CompletionTokenUsageInfo, UsageInfo
from libvllm.engine.entrypoints.openai.serving_beam import (
    BeamSteps,
    beam_finals,
    beam_search_params,
)
from libvllm.engine.entrypoints.openai.serving_engine import (
    ServingContext,
    build_sampling_params,
    common_sampling_values,
    refuse_unsupported,
)
from libvllm.engine.structured_output.response_format import structured_outputs_from_response_format
from libvllm.engine.tool_parsers.protocol import DeltaMessage

_UNSUPPORTED = {"mm_processor_kwargs": None, "media_io_kwargs": None,
                "kv_transfer_params": None}
_REQUEST_NAMES = {"logprobs": "top_logprobs", "extra_args": "vllm_xargs"}


class ChatJob:
    """One validated chat request, submitted to the engine."""

    def __init__(self, ctx: ServingContext, request: ChatCompletionRequest) -> None:
        ctx.check_model(request.model)
        refuse_unsupported(request, _UNSUPPORTED)
        check_tool_choice(request, ctx.tool_parser_cls, ctx.enable_auto_tools)
        max_out = request.max_completion_tokens if request.max_completion_tokens is not None \
            else request.max_tokens
        ctx.check_output_budget(max_out, "max_completion_tokens"
                                if request.max_completion_tokens is not None else "max_tokens")
        self.ctx, self.request = ctx, request
        self.id = f"chatcmpl-{request.request_id}"
        self.created = int(time.time())
        self.role = "assistant" if request.add_generation_prompt else \
            request.messages[-1].get("role") if request.messages else "assistant"
        tok = ctx.tokenizer("Chat completions")
        self.prompt_text = render_prompt(ctx.client.engine, request)
        self.decode = lambda t: tok.decode([t], skip_special_tokens=False)
        ids = encode_prompt(tok, self.prompt_text, ctx.max_model_len,
                            add_special_tokens=request.add_special_tokens,
                            truncating=request.truncate_prompt_tokens is not None)
        self.prompt_ids = ctx.fit_prompt(ids, request.truncate_prompt_tokens,
                                         request.truncation_side)
        parser = self.new_parser()
        values = _sampling_values(request, ctx.get_max_tokens(max_out, len(self.prompt_ids)))
        own = structured_outputs_from_response_format(request.structured_outputs,
                                                      request.response_format)
        values["structured_outputs"] = parser.tool_outputs(own, ctx.tool_strict_level) or own
        if parser.keep_special_tokens:  # tool-call markers may be special tokens
            values["skip_special_tokens"] = False
        self.beams = None
        if request.use_beam_search:  # the choices are the prompt's beams
            self.beams = [beam_search_params(request, values["structured_outputs"],
                                             values["max_tokens"], ctx.default_sampling,
                                             ctx.client.engine)]
            if parser.keep_special_tokens:
                self.beams[0].skip_special_tokens = False
            self.merged = BeamSteps()
            return
        sampling = build_sampling_params(values, _REQUEST_NAMES, ctx.default_sampling)
        self.merged = ctx.submit(self.id, [self.prompt_ids], [sampling],
                                 reasoning_parser_kwargs={
                                     "chat_template_kwargs": chat_template_kwargs(request)},
                                 priority=request.priority, cache_salt=request.cache_salt)

    def new_parser(self) -> ChatParser:
        """A parser for one choice (they keep streaming state)."""
        return ChatParser(self.ctx.client.engine.tokenizer, self.request,
                          self.ctx.tool_parser_cls, self.ctx.reasoning_parser_cls,
                          self.ctx.enable_auto_tools, self.ctx.structural_tags)

    def _echo_text(self) -> str:
        last = self.request.messages[-1] if self.request.messages else {}
        if last.get("role") != self.role:
            return ""
        content = last.get("content") or ""
        return content if isinstance(content, str) else \
            "\n".join(p.get("text", "") for p in content if isinstance(p, dict))

    def _logprobs(self, ids, lps):
        req = self.request
        # logprob_token_ids: every returned entry (the ids and the sampled token), as vLLM
        return chat_logprobs(ids, lps, -1 if req.logprob_token_ids else req.top_logprobs,
                             self.decode,
                             bool(req.return_tokens_as_token_ids)) if req.logprobs else None

    def _usage(self, completion_tokens: int, reasoning_tokens: int) -> UsageInfo:
        """Usage; completion_tokens_details.reasoning_tokens only with a reasoning parser."""
        pt = len(self.prompt_ids)
        details = None if self.ctx.reasoning_parser_cls is None else \
            CompletionTokenUsageInfo(reasoning_tokens=reasoning_tokens)
        return UsageInfo(prompt_tokens=pt, completion_tokens=completion_tokens,
                         total_tokens=pt + completion_tokens, completion_tokens_details=details)

    def _choice(self, index: int, final, echo: str) -> tuple[ChatCompletionResponseChoice, int]:
        """The choice and its number of reasoning tokens."""
        parser = self.new_parser()
        reasoning, content, calls = parser.parse(final.text)
        if echo:
            content = echo + (content or "")
        return ChatCompletionResponseChoice(
            index=index, message=ChatMessage(role=self.role, content=content,
                                             reasoning=reasoning, tool_calls=calls),
            logprobs=self._logprobs(final.token_ids, final.logprobs),
            finish_reason=resolve_finish_reason(final.finish_reason, self.request, bool(calls)),
            stop_reason=final.stop_reason,
            token_ids=final.token_ids if self.request.return_token_ids else None), \
            parser.count_reasoning_tokens(final.token_ids)

    def response(self) -> str:
        req = self.request
        finals = collect(self.merged) if self.beams is None else beam_finals(
            self.ctx, self.id, [self.prompt_ids], self.beams, self.merged, req.priority,
            req.cache_salt)
        echo = self._echo_text() if req.echo else ""
        choices, counts = zip(*(self._choice(i, f, echo) for i, f in sorted(finals.items()))) \
            if finals else ((), ())
        ct = sum(len(f.token_ids) for f in finals.values())
        return ChatCompletionResponse(
            id=self.id, created=self.created, model=self.ctx.served_model_name,
            choices=list(choices), usage=self._usage(ct, sum(counts)),
            prompt_token_ids=self.prompt_ids if req.return_token_ids else None,
            prompt_text=self.prompt_text if req.return_prompt_text else None).model_dump_json()

    def _chunk(self, choice, usage: UsageInfo | None = None, **extra) -> str:
        chunk = ChatCompletionStreamResponse(id=self.id, object="chat.completion.chunk",
                                             created=self.created, choices=[choice],
                                             model=self.ctx.served_model_name, **extra)
        if usage is not None:
            chunk.usage = usage
        return chunk.model_dump_json(exclude_unset=True, exclude_none=False)

    def chunks(self, clock: StreamClock):
        """Yields chunk JSON, or None when the clock ran out before the next chunk."""
        req, n = self.request, self.request.n or 1
        usage_on, continuous = include_usage(req.stream_options)
        sent, done = [0] * n, [False] * n
        parsers = [self.new_parser() for _ in range(n)]
        called = [False] * n  # a tool-call delta was sent (finish_reason tool_calls)
        generated: list[list[int]] = [[] for _ in range(n)]

        def usage(i: int) -> UsageInfo | None:
            return self._usage(sent[i], parsers[i].count_reasoning_tokens(generated[i])) \
                if continuous else None

        first = True
        for item in self.merged.items(clock):
            if item is None:
                yield None
                continue
            if first:
                first = False
                extra = {"prompt_token_ids": self.prompt_ids} if req.return_token_ids else {}
                if req.return_prompt_text:
                    extra["prompt_text"] = self.prompt_text
                for i in range(n):
                    yield self._chunk(ChatCompletionResponseStreamChoice(
                        index=i, delta=DeltaMessage(role=self.role, content=""), logprobs=None,
                        finish_reason=None), usage(i), **extra)
                echo = self._echo_text() if req.echo else ""
                for i in range(n if echo else 0):
                    yield self._chunk(ChatCompletionResponseStreamChoice(
                        index=i, delta=DeltaMessage(content=echo), logprobs=None,
                        finish_reason=None), usage(i))
            i, _, res = item
            for out in res.outputs:
                if done[i]:
                    continue
                if not out.text and not out.token_ids and not sent[i] and \
                        out.finish_reason is None:
                    continue
                sent[i] += len(out.token_ids)
                generated[i].extend(out.token_ids)
                finished = out.finish_reason is not None
                delta = parsers[i].parse_delta(out.text, list(out.token_ids),
                                               self.prompt_ids, finished)
                if delta is None and not finished:
                    continue
                called[i] |= bool(delta is not None and delta.tool_calls)
                fields = dict(index=i, delta=delta or DeltaMessage(content=""),
                              logprobs=self._logprobs(out.token_ids,
                                                      getattr(out, "logprobs", None)),
                              finish_reason=resolve_finish_reason(
                                  out.finish_reason, req, called[i]) if finished else None,
                              token_ids=list(out.token_ids) if req.return_token_ids else None)
                if finished:
                    fields["stop_reason"], done[i] = out.stop_reason, True
                yield self._chunk(ChatCompletionResponseStreamChoice(**fields), usage(i))
        if usage_on:
            reasoning = sum(p.count_reasoning_tokens(g) for p, g in zip(parsers, generated))
            final = ChatCompletionStreamResponse(
                id=self.id, object="chat.completion.chunk", created=self.created, choices=[],
                model=self.ctx.served_model_name, usage=self._usage(sum(sent), reasoning))
            yield final.model_dump_json(exclude_unset=True, exclude_none=True)


def _sampling_values(req: ChatCompletionRequest, max_tokens: int) -> dict:
    """ChatCompletionRequest.to_sampling_params of vLLM, as keyword arguments."""
    prompt_logprobs = req.prompt_logprobs
    if prompt_logprobs is None and req.echo:
        prompt_logprobs = req.top_logprobs
    return {**common_sampling_values(req, max_tokens),
            "logprobs": req.top_logprobs if req.logprobs and not req.logprob_token_ids
            else None,
            # vLLM turns echo into prompt_logprobs=0; only a positive count is asked of the
            # engine here, since the chat echo itself needs no prompt logprobs.
            "prompt_logprobs": prompt_logprobs or None}
