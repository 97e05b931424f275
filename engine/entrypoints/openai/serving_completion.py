"""POST /v1/completions: request -> engine requests -> CompletionResponse or stream chunks.

Mirrors vllm/entrypoints/openai/completion/serving.py (create_completion,
completion_stream_generator, request_output_to_completion_response) and
CompletionRequest.to_sampling_params: echo (max_tokens=0 echoes only), several prompts
(choice index = prompt_idx * n + i), usage, stream_options, return_token_ids,
response_format / structured_outputs (the grammar of every prompt's choices), and
use_beam_search (engine/entrypoints/openai/serving_beam.py).
"""

from __future__ import annotations

import time

from libvllm.engine.entrypoints.openai.accumulate import StreamClock, collect, include_usage
from libvllm.engine.entrypoints.openai.completion_protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from libvllm.engine.entrypoints.openai.logprobs import completion_logprobs
from libvllm.engine.entrypoints.openai.prompt_limits import encode_prompt
from libvllm.engine.entrypoints.openai.protocol import UsageInfo
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

# Fields whose feature this engine does not have yet: any non-default value is a 400.
_UNSUPPORTED = {"suffix": None, "prompt_embeds": None, "kv_transfer_params": None}
_REQUEST_NAMES = {"extra_args": "vllm_xargs"}


class CompletionJob:
    """One validated completion request, submitted to the engine."""

    def __init__(self, ctx: ServingContext, request: CompletionRequest) -> None:
        ctx.check_model(request.model)
        refuse_unsupported(request, _UNSUPPORTED)
        structured_outputs = structured_outputs_from_response_format(
            request.structured_outputs, request.response_format)
        ctx.check_output_budget(request.max_tokens or 0, "max_tokens")
        self.ctx, self.request = ctx, request
        self.id = f"cmpl-{request.request_id}"
        self.created = int(time.time())
        prompts = _prompt_list(request.prompt)
        tok = ctx.client.engine.tokenizer
        if tok is None and (request.echo or request.logprobs is not None or any(
                isinstance(p, str) for p in prompts)):
            tok = ctx.tokenizer("Text prompts, echo and logprobs")
        self.decode = lambda t: tok.decode([t], skip_special_tokens=False)
        truncating = request.truncate_prompt_tokens is not None
        self.prompts = [ctx.fit_prompt(  # tokenized outside the engine's lock
            encode_prompt(tok, p, ctx.max_model_len, truncating=truncating,
                          add_special_tokens=request.add_special_tokens)
            if isinstance(p, str) else list(p),
            request.truncate_prompt_tokens, request.truncation_side)
            for p in prompts]
        echo_only = request.echo and request.max_tokens == 0
        self.beams = None
        if request.use_beam_search:
            self.beams = [beam_search_params(
                request, structured_outputs, ctx.get_max_tokens(request.max_tokens, len(ids)),
                ctx.default_sampling, ctx.client.engine)
                for ids in self.prompts]
            self.merged = BeamSteps()
        else:
            samplings = [build_sampling_params({**_sampling_values(
                request, 1 if echo_only else ctx.get_max_tokens(request.max_tokens,
                                                                len(ids))),
                "structured_outputs": structured_outputs},
                _REQUEST_NAMES, ctx.default_sampling) for ids in self.prompts]
            self.merged = ctx.submit(self.id, self.prompts, samplings,
                                     priority=request.priority, cache_salt=request.cache_salt)
        self.prompt_texts = self._prompt_texts(tok) if request.echo else []

    def _prompt_texts(self, tok) -> list[str]:
        """What echo prepends: the prompt as sent, or its (truncated) tokens decoded."""
        prompts, whole = _prompt_list(self.request.prompt), \
            self.request.truncate_prompt_tokens is None
        return [p if isinstance(p, str) and whole else tok.decode(ids, skip_special_tokens=False)
                for p, ids in zip(prompts, self.prompts)]

    def _echo(self, p: int, text: str, ids: list[int], lps, prompt_lps) -> tuple:
        """Text, token ids and logprobs of a first output with the prompt prepended."""
        echo = "" if self.request.return_token_ids else self.prompt_texts[p]
        prompt_ids = self.prompts[p]
        prompt_lps = prompt_lps or [None] * len(prompt_ids)
        if self.request.max_tokens == 0:
            return echo, prompt_ids, prompt_lps
        return echo + text, [*prompt_ids, *ids], [*prompt_lps, *(lps or [])]

    def response(self) -> str:
        req = self.request
        finals = collect(self.merged) if self.beams is None else beam_finals(
            self.ctx, self.id, self.prompts, self.beams, self.merged, req.priority,
            req.cache_salt)
        choices, completion_tokens = [], 0
        for index in sorted(finals):
            f = finals[index]
            prompt_ids = self.prompts[f.prompt_idx]
            text, ids, lps = f.text, f.token_ids, f.logprobs
            if req.echo:
                text, ids, lps = self._echo(f.prompt_idx, text, ids, lps, f.prompt_logprobs)
            choices.append(CompletionResponseChoice(
                index=index, text=text, finish_reason=f.finish_reason, stop_reason=f.stop_reason,
                logprobs=None if req.logprobs is None else completion_logprobs(
                    ids, lps, _num_top(req), self.decode,
                    as_token_id=bool(req.return_tokens_as_token_ids)),
                prompt_token_ids=prompt_ids if req.return_token_ids else None,
                token_ids=f.token_ids if req.return_token_ids else None))
            completion_tokens += len(f.token_ids)
        prompt_tokens = sum(len(ids) for ids in self.prompts)
        usage = UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                          total_tokens=prompt_tokens + completion_tokens)
        return CompletionResponse(id=self.id, created=self.created,
                                  model=self.ctx.served_model_name, choices=choices,
                                  usage=usage).model_dump_json()

    def chunks(self, clock: StreamClock):
        """Yields chunk JSON, or None when the clock ran out before the next chunk."""
        req, n = self.request, self.request.n
        total = n * len(self.prompts)
        sent_tokens, echoed, offsets = [0] * total, [False] * total, [0] * total
        usage_on, continuous = include_usage(req.stream_options)
        for item in self.merged.items(clock):
            if item is None:
                yield None
                continue
            i, p, res = item
            for out in res.outputs:
                text, ids, lps = out.text, list(out.token_ids), getattr(out, "logprobs", None)
                prompt_ids_out = None
                if req.echo and not echoed[i]:
                    text, ids, lps = self._echo(p, text, ids, lps,
                                                getattr(res, "prompt_logprobs", None))
                    prompt_ids_out, echoed[i] = self.prompts[p], True
                else:
                    if not echoed[i] and req.return_token_ids:
                        prompt_ids_out, echoed[i] = self.prompts[p], True
                    if not text and not ids and not sent_tokens[i] and out.finish_reason is None:
                        continue
                logprobs = None
                if req.logprobs is not None:
                    logprobs = completion_logprobs(
                        ids, lps, _num_top(req), self.decode, offsets[i],
                        as_token_id=bool(req.return_tokens_as_token_ids))
                    if logprobs.tokens:
                        offsets[i] = logprobs.text_offset[-1] + len(logprobs.tokens[-1])
                sent_tokens[i] += len(out.token_ids)
                chunk = CompletionStreamResponse(
                    id=self.id, object="text_completion", created=self.created,
                    model=self.ctx.served_model_name,
                    choices=[CompletionResponseStreamChoice(
                        index=i, text=text, logprobs=logprobs, finish_reason=out.finish_reason,
                        stop_reason=out.stop_reason, prompt_token_ids=prompt_ids_out,
                        token_ids=list(out.token_ids) if req.return_token_ids else None)])
                if continuous:
                    pt, ct = len(self.prompts[p]), sent_tokens[i]
                    chunk.usage = UsageInfo(prompt_tokens=pt, completion_tokens=ct,
                                            total_tokens=pt + ct)
                yield chunk.model_dump_json(exclude_unset=True)
        if usage_on:
            pt, ct = sum(len(ids) for ids in self.prompts), sum(sent_tokens)
            final = CompletionStreamResponse(
                id=self.id, created=self.created, model=self.ctx.served_model_name, choices=[],
                usage=UsageInfo(prompt_tokens=pt, completion_tokens=ct, total_tokens=pt + ct))
            yield final.model_dump_json(exclude_unset=False, exclude_none=True)


def _prompt_list(prompt) -> list:
    """A completion prompt as a list of prompts (text or token ids)."""
    if isinstance(prompt, str) or prompt == [] or isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def _num_top(req: CompletionRequest) -> int | None:
    """Candidates a position: logprobs + 1; every returned entry (the ids and the sampled
    token) with logprob_token_ids, as vLLM."""
    return -1 if req.logprob_token_ids else req.logprobs


def _sampling_values(req: CompletionRequest, max_tokens: int) -> dict:
    """CompletionRequest.to_sampling_params of vLLM, as keyword arguments."""
    prompt_logprobs = req.prompt_logprobs
    if prompt_logprobs is None and req.echo:
        prompt_logprobs = req.logprobs
    return {**common_sampling_values(req, max_tokens),
            "logprobs": None if req.logprob_token_ids else req.logprobs,
            "prompt_logprobs": prompt_logprobs}
