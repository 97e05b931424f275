"""Serving steps shared by completions and chat: model check, prompt limits, max_tokens,
SamplingParams from a request, and submitting the n x prompts engine requests.

Mirrors vllm/entrypoints/serve/engine/serving.py (_check_model),
vllm/renderers/params.py (TokenizeParams checks, truncation, _token_len_check),
vllm/entrypoints/serve/utils/api_utils.py (get_max_tokens) and
vllm/v1/engine/parallel_sampling.py (n > 1: one child request per choice, seed + index).
"""

from __future__ import annotations

import inspect
import secrets
from typing import Any

from libvllm.engine.entrypoints.openai.errors import (
    VLLMNotFoundError,
    VLLMValidationError,
    not_supported,
)
from libvllm.engine.entrypoints.openai.prompt_limits import too_long_error
from libvllm.engine.entrypoints.openai.stream_merge import MergedStream
from libvllm.engine.reasoning import ReasoningParserManager
from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams
from libvllm.engine.tool_parsers import ToolParserManager
from libvllm.engine.tool_parsers.structural_tag import ToolStrictLevel

# the SamplingParams defaults the OpenAI layer fills in (the fields' own defaults)
_DEFAULT_SAMPLING = {name: getattr(SamplingParams, name) for name in (
    "repetition_penalty", "presence_penalty", "frequency_penalty", "temperature", "top_p",
    "top_k", "min_p")}


class ServingContext:
    """What every endpoint needs: the engine client, the served model's name and the
    server's parsers (--tool-call-parser, --enable-auto-tool-choice, --reasoning-parser)."""

    def __init__(self, client, served_model_name: str) -> None:
        self.client = client
        self.served_model_name = served_model_name
        # set when the engine was built and never changed: read without the engine's lock,
        # so that validation never waits for a step (vLLM's API server answers it alone)
        self.max_model_len = client.engine.model_info.max_model_len
        # generation_config.json defaults: request value > model default > vLLM default
        self.default_sampling = dict(client.engine.default_sampling_params)
        config = client.engine.config
        self.enable_auto_tools = config.enable_auto_tool_choice
        # vLLM's ParserManager.get_tool_parser: no parser without --enable-auto-tool-choice
        self.tool_parser_cls = ToolParserManager.get_tool_parser(config.tool_call_parser) \
            if config.tool_call_parser and self.enable_auto_tools else None
        self.reasoning_parser_cls = ReasoningParserManager.get_reasoning_parser(
            config.reasoning_parser) if config.reasoning_parser else None
        # structural tags of tool calls are xgrammar's (llguidance reads only the legacy form)
        self.structural_tags = config.structured_outputs_backend != "guidance"
        # --tool-strict-level: the floor of strict tool calling (None: the parser's default)
        self.tool_strict_level = None if config.tool_strict_level is None else \
            ToolStrictLevel.from_name(config.tool_strict_level)

    def tokenizer(self, what: str):
        """The engine's tokenizer; a 400 naming `what` when it runs without one
        (skip_tokenizer_init: only token-id prompts and token-id outputs)."""
        tok = self.client.engine.tokenizer
        if tok is None:
            raise VLLMValidationError(f"{what} need a tokenizer, and this server runs with "
                                      "skip_tokenizer_init")
        return tok

    def check_model(self, model: str | None) -> None:
        if model and model != self.served_model_name:
            raise VLLMNotFoundError(
                f"The model `{model}` does not exist. Valid aliases: "
                f"{self.served_model_name}.", parameter="model")

    def check_output_budget(self, max_output: int | None, param: str) -> None:
        if max_output is not None and max_output > self.max_model_len:
            raise VLLMValidationError(
                f"{param}={max_output} cannot be greater than max_model_len="
                f"{self.max_model_len}. Please request fewer output tokens.", parameter=param)

    def fit_prompt(self, ids: list[int], truncate: int | None, side: str | None) -> list[int]:
        """Truncation as asked, then the context-length check (vLLM's TokenizeParams)."""
        if truncate is not None:
            if truncate > self.max_model_len:
                raise VLLMValidationError(
                    f"truncate_prompt_tokens={truncate} cannot be greater than max_model_len "
                    f"= {self.max_model_len}. Please request a smaller truncation size.",
                    parameter="truncate_prompt_tokens")
            keep = self.max_model_len - 1 if truncate == -1 else truncate
            if keep < len(ids):
                ids = ids[len(ids) - keep:] if (side or "left") == "left" else ids[:keep]
        if len(ids) > self.max_model_len:
            raise too_long_error(self.max_model_len, len(ids))
        return ids

    def get_max_tokens(self, max_tokens: int | None, prompt_len: int) -> int:
        """vLLM's get_max_tokens: the context left, capped by the request's max_tokens or,
        when it has none, the model's generation_config max_new_tokens."""
        fallback = max_tokens if max_tokens is not None else self.default_sampling.get(
            "max_tokens")
        model_max = self.max_model_len - prompt_len
        return model_max if fallback is None else min(model_max, fallback)

    def submit(self, base_id: str, prompts: list[list[int]], samplings: list[dict[str, Any]],
               reasoning_parser_kwargs: dict | None = None, priority: int = 0,
               cache_salt: str | None = None) -> MergedStream:
        """One engine request per (prompt, choice); choice index = prompt_idx * n + i.
        samplings[p]: the SamplingParams keyword arguments of prompt p; priority and
        cache_salt (validated by the request model) are the request's."""
        streams, salt = [], secrets.token_hex(4)
        try:
            for p, (ids, sampling) in enumerate(zip(prompts, samplings)):
                n = sampling.get("n") or 1
                for i in range(n):
                    seed = None if sampling.get("seed") is None else sampling["seed"] + i
                    child = SamplingParams.from_optional(**{**sampling, "n": 1, "seed": seed})
                    stream = self.client.add_request(
                        f"{base_id}-{p}-{i}-{salt}", ids, child,
                        reasoning_parser_kwargs=reasoning_parser_kwargs, priority=priority,
                        cache_salt=cache_salt)
                    streams.append((p * n + i, p, stream))
        except BaseException:
            for _, _, stream in streams:
                stream.cancel()
            raise
        return MergedStream(streams)


def build_sampling_params(values: dict[str, Any], request_names: dict[str, str],
                          model_defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validated SamplingParams keyword arguments with vLLM's fallbacks (the request's value,
    else the model's generation_config default, else vLLM's); a value whose engine field does
    not exist yet is refused (named by its request field) unless it is vLLM's default."""
    model_defaults = model_defaults or {}
    values = {k: (model_defaults.get(k, _DEFAULT_SAMPLING.get(k)) if v is None else v)
              for k, v in values.items()}
    supported = inspect.signature(SamplingParams).parameters
    kept = {}
    for name, value in values.items():
        if name in supported:
            kept[name] = value
        elif value is not None:  # a vLLM field without an engine counterpart yet
            raise not_supported(request_names.get(name, name))
    kept["output_kind"] = RequestOutputKind.DELTA
    SamplingParams.from_optional(**kept)  # vLLM's checks (n under greedy...) before any request
    return kept


def common_sampling_values(req: Any, max_tokens: int) -> dict[str, Any]:
    """The SamplingParams keyword arguments that vLLM's CompletionRequest and
    ChatCompletionRequest.to_sampling_params take alike from the request; each endpoint adds
    its logprobs and prompt_logprobs."""
    return dict(
        n=req.n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
        min_p=req.min_p, presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty, repetition_penalty=req.repetition_penalty,
        seed=req.seed, stop=req.stop, stop_token_ids=req.stop_token_ids,
        logprob_token_ids=req.logprob_token_ids or None, ignore_eos=req.ignore_eos,
        max_tokens=max_tokens, min_tokens=req.min_tokens,
        skip_special_tokens=True if req.skip_special_tokens is None else req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output,
        stream_interval=req.stream_interval, logit_bias=req.logit_bias,
        allowed_token_ids=req.allowed_token_ids, bad_words=req.bad_words,
        extra_args=req.vllm_xargs or None, repetition_detection=req.repetition_detection,
        thinking_token_budget=req.thinking_token_budget)


def refuse_unsupported(request: Any, fields: dict[str, Any]) -> None:
    """400 for request fields that ask for a feature this server does not have yet."""
    for name, default in fields.items():
        if getattr(request, name) not in (default, None):
            raise not_supported(name)
