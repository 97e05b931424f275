"""/v1/completions request and response models.

Mirrors vllm/entrypoints/openai/completion/protocol.py (CompletionRequest fields, defaults
and its mode="before" validators, in the same order and with the same messages;
CompletionResponse / CompletionStreamResponse shapes). Beam search, prompt embeds, FIM
suffix and structured outputs are declared so that serving_completion can reject them.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from libvllm.engine.entrypoints.openai.errors import VLLMValidationError
from libvllm.engine.entrypoints.openai.protocol import (
    INT64_MAX,
    INT64_MIN,
    MAX_COMPLETION_PROMPTS,
    OpenAIBaseModel,
    Seed,
    StopParam,
    StreamOptions,
    ThinkingTokenBudget,
    TruncatePromptTokens,
    UsageInfo,
    check_stream_options,
    random_uuid,
    validate_cache_salt,
)

TokenId = Annotated[int, Field(ge=0)]


class CompletionRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str] | None = None
    echo: bool | None = False
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    max_tokens: int | None = 16
    n: int = 1
    presence_penalty: float | None = None
    seed: Seed | None = None
    stop: StopParam = []
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = []
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    truncation_side: Literal["left", "right"] | None = None
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list)
    prompt_embeds: bytes | list[bytes] | None = None
    add_special_tokens: bool = True
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    request_id: str = Field(default_factory=random_uuid)
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    repetition_detection: dict[str, Any] | None = None
    thinking_token_budget: ThinkingTokenBudget = None
    stream_interval: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _validate_before(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        validate_cache_salt(data.get("cache_salt"))
        if data.get("max_tokens") is None:  # null means the default, 16
            data = {**data, "max_tokens": 16}
        check_response_format(data)
        check_structured_outputs_count(data)
        _check_logprobs(data)
        check_stream_options(data)
        _check_prompt(data)
        return data


def check_response_format(data: dict) -> None:
    rf = data.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema" and rf.get("json_schema") is None:
        raise VLLMValidationError(
            "When response_format type is 'json_schema', the 'json_schema' field must be "
            "provided.", parameter="response_format")


def check_structured_outputs_count(data: dict) -> None:
    so = data.get("structured_outputs")
    if isinstance(so, dict) and sum(so.get(k) is not None for k in ("json", "regex", "choice")) > 1:
        raise VLLMValidationError(
            "You can only use one kind of constraints for structured outputs ('json', "
            "'regex' or 'choice').", parameter="structured_outputs")
    if isinstance(so, dict) and any(so.get(k) is not None for k in ("json", "regex", "choice")) \
            and data.get("tool_choice", "none") not in ("none", "auto", "required"):
        raise VLLMValidationError(
            "You can only either use constraints for structured outputs or tools, not both.")


def check_prompt_logprobs(data: dict) -> None:
    if (prompt_logprobs := data.get("prompt_logprobs")) is not None:
        if data.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise VLLMValidationError(
                "`prompt_logprobs` are not available when `stream=True`.",
                parameter="prompt_logprobs")
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise VLLMValidationError(
                "`prompt_logprobs` must be a positive value or -1.", parameter="prompt_logprobs")


def check_numeric(data: dict, names: tuple[str, ...]) -> None:
    for name in names:
        value = data.get(name)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise VLLMValidationError(f"`{name}` must be an integer.", parameter=name)


def _check_logprobs(data: dict) -> None:
    if data.get("logprob_token_ids") and data.get("use_beam_search"):
        raise VLLMValidationError(
            "`logprob_token_ids` is not supported with beam search.",
            parameter="logprob_token_ids")
    if data.get("use_beam_search") and data.get("echo") and data.get("logprobs") is not None:
        raise VLLMValidationError(
            "`echo` with `logprobs` is not supported with beam search because beam search "
            "does not compute prompt logprobs.", parameter="echo")
    if data.get("logprob_token_ids") and data.get("echo") and data.get("max_tokens") == 0:
        raise VLLMValidationError(
            "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` "
            "because no output tokens are generated.", parameter="logprob_token_ids")
    if data.get("logprob_token_ids") and data.get("logprobs") is None:
        raise VLLMValidationError(
            "when using `logprob_token_ids`, `logprobs` must be set.",
            parameter="logprob_token_ids")
    check_numeric(data, ("prompt_logprobs", "logprobs"))
    check_prompt_logprobs(data)
    if (logprobs := data.get("logprobs")) is not None and logprobs < 0 and logprobs != -1:
        raise VLLMValidationError(
            "`logprobs` must be a positive value or -1.", parameter="logprobs")


def _check_prompt(data: dict) -> None:
    prompt, embeds = data.get("prompt"), data.get("prompt_embeds")
    if (prompt is None or prompt == "") and (embeds is None or embeds == []):
        raise VLLMValidationError(
            "Either prompt or prompt_embeds must be provided and non-empty.", parameter="prompt")
    if isinstance(prompt, list) and len(prompt) > MAX_COMPLETION_PROMPTS and \
            not all(isinstance(p, int) for p in prompt):
        raise VLLMValidationError(
            f"prompt list length {len(prompt)} exceeds the maximum allowed count of "
            f"{MAX_COMPLETION_PROMPTS}. To increase this limit, set the "
            "VLLM_MAX_COMPLETION_PROMPTS environment variable.", parameter="prompt")


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: list[dict[int, Any] | None] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    service_tier: str | None = None
    system_fingerprint: str | None = None
    usage: UsageInfo


class CompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = Field(default=None)
    system_fingerprint: str | None = None
