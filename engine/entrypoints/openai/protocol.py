"""Shared OpenAI protocol models: base model, usage, models list, tokenize, validators.

Mirrors vllm/entrypoints/serve/engine/protocol.py (OpenAIBaseModel, UsageInfo, ModelCard;
the error body is built in errors.py), vllm/entrypoints/generate/base/protocol.py (StreamOptions,
StopParam, validate_cache_salt) and vllm/entrypoints/serve/tokenize/protocol.py.
Unknown request fields are accepted and ignored, as in vLLM (extra="allow").
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, TypeAlias

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_serializer,
    model_validator,
)

from libvllm.engine.entrypoints.openai.errors import VLLMValidationError
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.sampling_params import validate_thinking_token_budget

MAX_STOP_STRINGS = 4  # VLLM_MAX_STOP_STRINGS
MAX_COMPLETION_PROMPTS = 1024  # VLLM_MAX_COMPLETION_PROMPTS
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

StopParam: TypeAlias = str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None
# `top_logprobs` is nullable in the OpenAI spec; null means the same as omitted.
TopLogprobsParam: TypeAlias = Annotated[int, BeforeValidator(lambda v: 0 if v is None else v)]
Seed: TypeAlias = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
TruncatePromptTokens: TypeAlias = Annotated[int, Field(ge=-1, le=INT64_MAX)]


def _thinking_token_budget(value: Any) -> int | None:
    try:
        return validate_thinking_token_budget(value)
    except InvalidArgumentError as e:
        raise VLLMValidationError(str(e), parameter="thinking_token_budget") from None


# vLLM's ThinkingTokenBudget: checked before pydantic could coerce it (True, 10.0, "5")
ThinkingTokenBudget: TypeAlias = Annotated[int | None, BeforeValidator(_thinking_token_budget)]


def random_uuid() -> str:
    return uuid.uuid4().hex


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class CompletionTokenUsageInfo(OpenAIBaseModel):
    reasoning_tokens: int | None = None


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    # only with a reasoning parser, as vLLM's _include_reasoning_tokens_details
    completion_tokens_details: CompletionTokenUsageInfo | None = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler):
        data = handler(self)
        if data.get("completion_tokens_details") is None:
            data.pop("completion_tokens_details", None)
        return data


class ModelPermission(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"modelperm-{random_uuid()}")
    object: str = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(OpenAIBaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=list)


class ModelList(OpenAIBaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


def validate_cache_salt(cache_salt: object) -> None:
    if cache_salt is None:
        return
    if not isinstance(cache_salt, str) or not cache_salt:
        raise VLLMValidationError(
            "Parameter 'cache_salt' must be a non-empty string if provided.",
            parameter="cache_salt")
    if len(cache_salt) > 128 or any(c in "@/\\\x00" for c in cache_salt):
        raise VLLMValidationError(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain "
            "'@', '/', '\\\\', or NUL.", parameter="cache_salt")


def check_stream_options(data: Any) -> Any:
    if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
        raise VLLMValidationError(
            "Stream options can only be defined when `stream=True`.", parameter="stream_options")
    return data


def check_generation_prompt(data: Any) -> Any:
    if isinstance(data, dict) and data.get("continue_final_message") and \
            data.get("add_generation_prompt"):
        raise VLLMValidationError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    return data


class TokenizeCompletionRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(OpenAIBaseModel):
    model: str | None = None
    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _validate_before(cls, data: Any) -> Any:
        return check_generation_prompt(data)


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0, le=INT64_MAX)]]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
