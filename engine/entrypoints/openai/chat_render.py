"""Chat request -> prompt text, with the model's (sandboxed) chat template.

Mirrors vllm/renderers/online_renderer.py (validate_chat_template: a template sent with the
request is refused without --trust-request-chat-template, which this server does not
have; chat_template_kwargs are passed to the template, with `documents`, `reasoning_effort`
and the `enable_thinking` it implies added as ChatCompletionRequest.build_chat_params of
vllm/entrypoints/openai/chat_completion/protocol.py does) and transformers'
apply_chat_template(continue_final_message=True) (cut after the last message's content).
Needs no engine lock (the tokenizer and the compiled template are read-only).
"""

from __future__ import annotations

from libvllm.engine.chat_template import render_chat_template
from libvllm.engine.entrypoints.openai.chat_protocol import ChatCompletionRequest
from libvllm.engine.entrypoints.openai.errors import VLLMValidationError

_NO_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you "
                "must provide a chat template if the tokenizer does not define one.")
_EMPTY = "Cannot apply chat template to an empty conversation. Provide at least one message."
_UNTRUSTED = ("Chat template is passed with request, but --trust-request-chat-template is not "
              "set. Refused request with untrusted chat template.")


def chat_template_kwargs(request) -> dict:
    """The request's chat_template_kwargs with what build_chat_params adds for a chat
    completion: `documents`, `reasoning_effort` and the `enable_thinking` it implies (the
    reasoning parsers read the same dict; a chat-tokenize request has none of these fields,
    whatever extra keys its body carries)."""
    kwargs = dict(request.chat_template_kwargs or {})
    if not isinstance(request, ChatCompletionRequest):
        return kwargs
    effort = request.reasoning_effort
    if effort is not None and "enable_thinking" not in kwargs:  # opt-in templates (Gemma 4)
        kwargs["enable_thinking"] = effort != "none"
    kwargs.update({k: v for k, v in (("documents", request.documents),
                                     ("reasoning_effort", effort)) if v is not None})
    return kwargs


def render_prompt(engine, request) -> str:
    """The prompt text of a chat or chat-tokenize request (the caller tokenizes it:
    engine/entrypoints/openai/prompt_limits.py)."""
    kwargs = chat_template_kwargs(request)
    if request.chat_template is not None or kwargs.get("chat_template") is not None:
        raise VLLMValidationError(_UNTRUSTED)
    if not request.messages:  # transformers' apply_chat_template, which vLLM calls
        raise VLLMValidationError(_EMPTY)
    tok = engine.tokenizer
    if not tok.chat_template:
        raise VLLMValidationError(_NO_TEMPLATE)
    for reserved in ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token"):
        kwargs.pop(reserved, None)
    text = render_chat_template(
        tok.chat_template, request.messages, add_generation_prompt=request.add_generation_prompt,
        bos_token=tok.bos_token or "", eos_token=tok.eos_token or "",
        tools=getattr(request, "tools", None), **kwargs)
    if request.continue_final_message:
        if request.add_generation_prompt:  # transformers' apply_chat_template refuses this
            raise VLLMValidationError(
                "continue_final_message and add_generation_prompt are not compatible. Use "
                "continue_final_message when you want the model to continue the final message, "
                "and add_generation_prompt when you want to add a header that will prompt it to "
                "start a new assistant message instead.", parameter="continue_final_message")
        text = _cut_after_final_message(text, request.messages)
    return text


def _cut_after_final_message(text: str, messages: list[dict]) -> str:
    final = messages[-1].get("content") if messages else None
    if isinstance(final, list):
        final = final[-1].get("text") if final and isinstance(final[-1], dict) else None
    if not isinstance(final, str):
        raise VLLMValidationError("continue_final_message needs a final message with text "
                                  "content.", parameter="continue_final_message")
    for needle in (final, final.strip()):
        if needle in text:
            return text[: text.rindex(needle) + len(needle)]
    raise VLLMValidationError(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template! This can happen if the chat template deletes portions of "
        "the final message. Please verify the chat template and final message in your chat "
        "to ensure they are compatible.", parameter="continue_final_message")
