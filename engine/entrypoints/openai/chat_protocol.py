"""/v1/chat/completions request and response models.

Mirrors vllm/entrypoints/openai/chat_completion/protocol.py (ChatCompletionRequest fields,
defaults and mode="before" validators with vLLM's messages; ChatCompletionResponse,
ChatCompletionStreamResponse and the chat logprobs shapes; ChatMessage.tool_calls left out
when empty, as vLLM's responses show it).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError, model_validator

from libvllm.engine.entrypoints.openai.completion_protocol import (
    check_numeric,
    check_prompt_logprobs,
    check_response_format,
    check_structured_outputs_count,
)
from libvllm.engine.entrypoints.openai.errors import VLLMValidationError
from libvllm.engine.entrypoints.openai.protocol import (
    INT64_MAX,
    INT64_MIN,
    OpenAIBaseModel,
    Seed,
    StopParam,
    StreamOptions,
    ThinkingTokenBudget,
    TopLogprobsParam,
    TruncatePromptTokens,
    UsageInfo,
    check_generation_prompt,
    check_stream_options,
    random_uuid,
    validate_cache_salt,
)
from libvllm.engine.tool_parsers.protocol import DeltaMessage, OmitEmptyToolCalls, ToolCall


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatCompletionToolsParam(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


def _validated_tool(tool: dict[str, Any]) -> dict[str, Any]:
    ChatCompletionToolsParam.model_validate(tool)
    return tool


# A tool as the template and the tool parsers read it (a dict), checked by vLLM's model.
ToolParam = Annotated[dict[str, Any], AfterValidator(_validated_tool)]
_TOOLS = TypeAdapter(list[ToolParam] | None)


class ChatCompletionRequest(OpenAIBaseModel):
    messages: list[dict[str, Any]]
    model: str | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = False
    top_logprobs: TopLogprobsParam = 0
    max_tokens: int | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: int | None = None
    n: int | None = 1
    presence_penalty: float | None = None
    response_format: dict[str, Any] | None = None
    seed: Seed | None = None
    stop: StopParam = []
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[ToolParam] | None = None
    tool_choice: str | dict[str, Any] | None = "none"
    # vLLM's ReasoningEffort (vllm/renderers/params.py); handed to the chat template
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh",
                              "max"] | None = None
    thinking_token_budget: ThinkingTokenBudget = None
    include_reasoning: bool = True
    parallel_tool_calls: bool | None = True
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
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list)
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    structured_outputs: dict[str, Any] | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    request_id: str = Field(default_factory=random_uuid)
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    return_prompt_text: bool | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    repetition_detection: dict[str, Any] | None = None
    stream_interval: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _validate_before(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        validate_cache_salt(data.get("cache_salt"))
        _rename_reasoning_content(data)
        check_response_format(data)
        check_stream_options(data)
        _check_logprobs(data)
        check_structured_outputs_count(data)
        _check_tool_usage(data)
        check_generation_prompt(data)
        return data


def _rename_reasoning_content(data: dict) -> None:
    """vLLM renames the deprecated input field reasoning_content to reasoning."""
    for msg in data.get("messages") or []:
        if isinstance(msg, dict) and msg.get("reasoning_content") is not None:
            value = msg.pop("reasoning_content")
            msg.setdefault("reasoning", value)


def _check_logprobs(data: dict) -> None:
    if data.get("logprob_token_ids") and data.get("use_beam_search"):
        raise VLLMValidationError(
            "`logprob_token_ids` is not supported with beam search.",
            parameter="logprob_token_ids")
    if data.get("logprob_token_ids") and not data.get("logprobs"):
        raise VLLMValidationError(
            "when using `logprob_token_ids`, `logprobs` must be set to true.",
            parameter="logprob_token_ids")
    check_numeric(data, ("prompt_logprobs", "top_logprobs"))
    check_prompt_logprobs(data)
    if (top_logprobs := data.get("top_logprobs")) is not None:
        if top_logprobs < 0 and top_logprobs != -1:
            raise VLLMValidationError(
                "`top_logprobs` must be a positive value or -1.", parameter="top_logprobs")
        if (top_logprobs == -1 or top_logprobs > 0) and not data.get("logprobs"):
            raise VLLMValidationError(
                "when using `top_logprobs`, `logprobs` must be set to true.",
                parameter="top_logprobs")


def _check_tool_usage(data: dict) -> None:
    try:  # malformed tools: the field's own validation reports them, as in vLLM
        _TOOLS.validate_python(data.get("tools"))
    except ValidationError:
        return
    if data.get("tools") == []:
        raise VLLMValidationError(
            "`tools` must not be an empty array. Either provide at least one tool or omit "
            "the field entirely.", parameter="tools")
    if "tool_choice" not in data and data.get("tools"):
        data["tool_choice"] = "auto"
    choice = data.get("tool_choice")
    if choice is None or choice == "none":
        return
    if data.get("tools") is None:
        raise VLLMValidationError(
            "When using `tool_choice`, `tools` must be set.", parameter="tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise VLLMValidationError(
            f"Invalid value for `tool_choice`: {choice}! Only named tools, \"none\", "
            "\"auto\" or \"required\" are supported.", parameter="tool_choice")
    if isinstance(choice, dict):
        _check_named_tool(choice, data["tools"])


def _check_named_tool(choice: dict, tools: list) -> None:
    usage = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
    function = choice.get("function")
    if not isinstance(function, dict):
        raise VLLMValidationError(
            f"Invalid value for `function`: `{function}` in `tool_choice`! {usage}",
            parameter="tool_choice.function")
    if "name" not in function:
        raise VLLMValidationError(f"Expected field `name` in `function` in `tool_choice`! "
                                  f"{usage}", parameter="tool_choice.function.name")
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise VLLMValidationError(f"Invalid `name` in `function`: `{name}` in `tool_choice`! "
                                  f"{usage}", parameter="tool_choice.function.name")
    names = [(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)]
    if name not in names:
        raise VLLMValidationError("The tool specified in `tool_choice` does not match any of "
                                  "the specified `tools`", parameter="tool_choice")


class ChatMessage(OpenAIBaseModel, OmitEmptyToolCalls):
    role: str
    content: str | None = None
    refusal: str | None = None
    annotations: Any | None = None
    audio: Any | None = None
    function_call: Any | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning: str | None = None


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    service_tier: str | None = None
    system_fingerprint: str | None = None
    usage: UsageInfo
    prompt_logprobs: list[dict[int, Any] | None] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = Field(default=None)
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
