"""The chat request fields that reach the chat template (vllm/entrypoints/openai/
chat_completion/protocol.py ChatCompletionRequest.build_chat_params): `reasoning_effort`
(one of vLLM's ReasoningEffort values, "max" included) and `documents` join the
chat_template_kwargs, overriding the request's own kwargs of those names; a set effort
also sets `enable_thinking` (effort != "none") unless the request's kwargs name it.

Mirrors vLLM 0.33 tests/entrypoints/openai/chat_completion/test_chat.py
(test_chat_completion_request_accepts_model_specific_reasoning_effort,
test_chat_completion_request_rejects_unknown_reasoning_effort); the template here prints
what it was given.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from libvllm.engine.entrypoints.openai.chat_protocol import ChatCompletionRequest
from libvllm.engine.entrypoints.openai.chat_render import render_prompt
from libvllm.engine.entrypoints.openai.protocol import TokenizeChatRequest

TEMPLATE = ("{{ reasoning_effort }}|{{ enable_thinking }}|"
            "{{ documents|map(attribute='title')|join(',') if documents else 'none' }}|"
            "{{ extra }}")
ENGINE = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=TEMPLATE, bos_token="",
                                                   eos_token=""))
HELLO = [{"role": "user", "content": "Hello"}]


def _render(**fields) -> str:
    return render_prompt(ENGINE, ChatCompletionRequest.model_validate(
        {"model": "m", "messages": HELLO, **fields}))


@pytest.mark.parametrize("fields, want", [
    ({}, "||none|"),
    ({"reasoning_effort": "max"}, "max|True|none|"),
    ({"reasoning_effort": "none"}, "none|False|none|"),
    ({"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False,
                                                          "extra": 1}}, "low|False|none|1"),
    ({"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}},
     "high|True|none|"),
    ({"chat_template_kwargs": {"reasoning_effort": "low"}}, "low||none|"),
    ({"documents": [{"title": "a", "text": "x"}, {"title": "b", "text": "y"}]}, "||a,b|"),
])
def test_fields_reach_the_template(fields, want):
    assert _render(**fields) == want


def test_unknown_reasoning_effort_is_refused():
    with pytest.raises(ValueError, match="Input should be"):
        ChatCompletionRequest.model_validate({"model": "m", "messages": HELLO,
                                              "reasoning_effort": "extra_high"})


def test_chat_tokenize_requests_carry_none_of_them():
    """vLLM's tokenize request has neither field: extra keys of its body stay out of the
    template (its chat_template_kwargs still reach it)."""
    request = TokenizeChatRequest.model_validate({
        "messages": HELLO, "reasoning_effort": {"x": 1}, "documents": "not-a-list",
        "chat_template_kwargs": {"extra": 2}})
    assert render_prompt(ENGINE, request) == "||none|2"
