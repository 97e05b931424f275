"""Reasoning parsers (deepseek_r1, qwen3): (reasoning, content) of a finished output, the
same split rebuilt from streamed deltas, the token-id end checks, and the structured-output
gate (no grammar constraint until reasoning ends) driven by those checks.

Oracles: the expected splits of the upstream tests ported here - vLLM 0.33
tests/reasoning/{utils.py (the streaming reconstructor), test_deepseekr1_reasoning_parser.py,
test_qwen3_reasoning_parser.py}; for the gate, vllm/reasoning/AGENTS.md's rule that end
detection agrees with extraction. Upstream uses the DeepSeek-R1 / Qwen3 tokenizers; here the
default model's tokenizer carries <think>, </think>, <tool_call> as added control tokens.
"""

from __future__ import annotations

import pytest
from tokenizers.decoders import DecodeStream

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.reasoning import ReasoningParserManager
from libvllm.engine.structured_output import (
    StructuredOutputManager,
    StructuredOutputRequest,
    StructuredOutputsParams,
)
from libvllm.engine.tokenizer import Tokenizer

MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]


def _tokenizer(model_path: str, markers: list[str]) -> Tokenizer:
    """The default model's tokenizer with `markers` appended as control tokens."""
    reader = GGUFReader(model_path)
    md = dict(reader.metadata)
    reader.close()
    md["tokenizer.ggml.tokens"] = [*md["tokenizer.ggml.tokens"], *markers]
    md["tokenizer.ggml.token_type"] = [*md["tokenizer.ggml.token_type"], *[3] * len(markers)]
    return Tokenizer.from_gguf_metadata(md)


@pytest.fixture(scope="module")
def tokenizer(model_path) -> Tokenizer:
    return _tokenizer(model_path, MARKERS)


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def token_deltas(tokenizer: Tokenizer, text: str) -> list[tuple[str, list[int]]]:
    stream = DecodeStream(skip_special_tokens=False)
    return [(stream.step(tokenizer.backend, i) or "", [i]) for i in _ids(tokenizer, text)]


def run_streaming(parser, deltas) -> tuple[str | None, str | None]:
    """(reasoning, content) rebuilt from the deltas; a delta never carries both."""
    reasoning = content = None
    previous, previous_ids = "", []
    for delta, ids in deltas:
        current, current_ids = previous + delta, previous_ids + ids
        message = parser.extract_reasoning_streaming(
            previous, current, delta, previous_ids, current_ids, ids
        )
        if message is not None:
            assert message.content is None or message.reasoning is None
            if message.content is not None:
                content = (content or "") + message.content
            elif message.reasoning is not None:
                reasoning = (reasoning or "") + message.reasoning
        previous, previous_ids = current, current_ids
    return reasoning, content or None


def _run(parser, tokenizer, output: str, streaming: bool):
    if streaming:
        return run_streaming(parser, token_deltas(tokenizer, output))
    return parser.extract_reasoning(output)


# ---- test_deepseekr1_reasoning_parser.py -----------------------------------------------------

R1_CASES = [
    # (streaming, output, reasoning, content, is_reasoning_end)
    (
        False,
        "This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
        True,
    ),
    (
        True,
        "This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
        True,
    ),
    (False, "This is a reasoning section</think>", "This is a reasoning section", None, True),
    (True, "This is a reasoning section</think>", "This is a reasoning section", None, True),
    (False, "This is content", "This is content", None, False),
    (True, "This is a reasoning section", "This is a reasoning section", None, False),
    (
        False,
        "This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
        True,
    ),
    (
        True,
        "This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
        True,
    ),
    (True, "</think>This is the rest", None, "This is the rest", True),
    (False, "</think>This is the rest", "", "This is the rest", True),
    (
        False,
        "<think>This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
        True,
    ),
    (
        True,
        "<think>This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
        True,
    ),
    (
        False,
        "<think>This is a reasoning section</think>",
        "This is a reasoning section",
        None,
        True,
    ),
    (True, "<think>This is a reasoning section</think>", "This is a reasoning section", None, True),
    (
        False,
        "<think>This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
        True,
    ),
    (
        True,
        "<think>This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
        True,
    ),
    (False, "<think></think>This is the rest", "", "This is the rest", True),
    (True, "<think></think>This is the rest", None, "This is the rest", True),
    (False, "<think>This is a reasoning section", "This is a reasoning section", None, False),
    (True, "<think>This is a reasoning section", "This is a reasoning section", None, False),
    (False, "", "", None, False),
    (True, "", None, None, False),
    (
        False,
        "\n<think>This is a reasoning section</think>\nThis is the rest",
        "This is a reasoning section",
        "\nThis is the rest",
        True,
    ),
    # streaming cannot know the text before <think> was not reasoning
    (
        True,
        "\n<think>This is a reasoning section</think>\nThis is the rest",
        "\nThis is a reasoning section",
        "\nThis is the rest",
        True,
    ),
]


@pytest.mark.parametrize("streaming, output, reasoning, content, is_end", R1_CASES)
def test_deepseek_r1(tokenizer, streaming, output, reasoning, content, is_end):
    parser = ReasoningParserManager.get_reasoning_parser("deepseek_r1")(tokenizer)
    assert _run(parser, tokenizer, output, streaming) == (reasoning, content)
    ids = _ids(tokenizer, output)
    assert parser.is_reasoning_end(ids) == is_end
    expected_ids = _ids(tokenizer, content) if content is not None else []
    assert parser.extract_content_ids(ids) == expected_ids


def test_parsers_need_think_tokens(model_path):
    plain = _tokenizer(model_path, [])
    for name in ("deepseek_r1", "qwen3"):
        with pytest.raises(InvalidArgumentError, match="could not locate think start/end"):
            ReasoningParserManager.get_reasoning_parser(name)(plain)
    with pytest.raises(KeyError, match="Reasoning parser 'nope' not found"):
        ReasoningParserManager.get_reasoning_parser("nope")


# ---- test_qwen3_reasoning_parser.py ----------------------------------------------------------

TOOL_CALL_BODY = (
    "<tool_call>\n<function=bash>\n<parameter=command>\ncat /etc/hosts\n"
    "</parameter>\n</function>\n</tool_call>"
)
QWEN3_CASES = [
    # (output, reasoning, content), checked streamed and not
    (
        "This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
    ),
    ("This is a reasoning section</think>", "This is a reasoning section", None),
    (
        "<think>This is a reasoning section</think>This is the rest",
        "This is a reasoning section",
        "This is the rest",
    ),
    ("This is the rest", "This is the rest", None),  # thinking on, truncated: all reasoning
    ("<think>This is a reasoning section</think>", "This is a reasoning section", None),
    (
        "<think>This is a reasoning\nsection</think>This is the rest\nThat",
        "This is a reasoning\nsection",
        "This is the rest\nThat",
    ),
    ("<think>This is a reasoning section", "This is a reasoning section", None),
    (
        "I need to read the file.\n\n" + TOOL_CALL_BODY,
        "I need to read the file.\n\n",
        TOOL_CALL_BODY,
    ),
    (
        "<think>I need to read the file.\n\n" + TOOL_CALL_BODY,
        "I need to read the file.\n\n",
        TOOL_CALL_BODY,
    ),
]


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("output, reasoning, content", QWEN3_CASES)
def test_qwen3(tokenizer, streaming, output, reasoning, content):
    parser = ReasoningParserManager.get_reasoning_parser("qwen3")(tokenizer)
    assert _run(parser, tokenizer, output, streaming) == (reasoning, content)
    ends = content is not None or "</think>" in output
    assert parser.is_reasoning_end(_ids(tokenizer, output)) == ends


@pytest.mark.parametrize(
    "deltas, reasoning, content",
    [
        (
            ["<think>This is a reasoning section", "</think>", "This is the rest"],
            "This is a reasoning section",
            "This is the rest",
        ),
        (
            ["reasoning section", "</think>This is the rest"],
            "reasoning section",
            "This is the rest",
        ),
        (["<think>reasoning</think>"], "reasoning", None),
        (["reasoning section", "</think>content"], "reasoning section", "content"),
        (
            ["I need to read the file.\n\n", "<tool_call>\n<function=bash>"],
            "I need to read the file.\n\n",
            "<tool_call>\n<function=bash>",
        ),
        (["partial </th", "ink>then content"], "partial ", "then content"),
    ],
)
def test_qwen3_streaming_multi_token_deltas(tokenizer, deltas, reasoning, content):
    parser = ReasoningParserManager.get_reasoning_parser("qwen3")(tokenizer)
    assert run_streaming(parser, [(d, _ids(tokenizer, d)) for d in deltas]) == (reasoning, content)


@pytest.mark.parametrize(
    "output",
    ["This is plain content", "I need to read the file.\n\n" + TOOL_CALL_BODY],
)
def test_qwen3_thinking_disabled(tokenizer, output):
    parser = ReasoningParserManager.get_reasoning_parser("qwen3")(
        tokenizer, chat_template_kwargs={"enable_thinking": False}
    )
    assert parser.extract_reasoning(output) == (None, output)
    assert run_streaming(parser, token_deltas(tokenizer, output)) == (None, output)


# ---- the structured-output gate (vllm/v1/structured_output/__init__.py) ----------------------


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
def test_structured_output_waits_for_reasoning_end(tokenizer, name):
    reasoner = ReasoningParserManager.get_reasoning_parser(name)
    manager = StructuredOutputManager(tokenizer, tokenizer.vocab_size, reasoner_cls=reasoner)
    params = manager.validate(StructuredOutputsParams(regex="[0-9]+"))
    req = StructuredOutputRequest(
        params, stop_token_ids={tokenizer.eos_token_id}, prompt_token_ids=_ids(tokenizer, "<think>")
    )
    manager.grammar_init(req)
    req.wait_grammar()
    words = _ids(tokenizer, "let me think")

    def allowed(token_id: int) -> bool:
        row = manager.grammar_bitmask([req])[0]
        return bool(int(row[token_id >> 5]) >> (token_id & 31) & 1)

    assert allowed(words[0])  # reasoning: unconstrained
    assert manager.accept_tokens(req, words) and not req.reasoning_ended
    end = _ids(tokenizer, "</think>42")  # the end token and a digit in one step
    assert manager.accept_tokens(req, end) and req.reasoning_ended
    assert not allowed(words[0]) and allowed(_ids(tokenizer, "7")[0])
    if name == "qwen3":  # <tool_call> ends reasoning implicitly and is itself content
        req2 = StructuredOutputRequest(
            manager.validate(StructuredOutputsParams(regex="x")), prompt_token_ids=[]
        )
        manager.grammar_init(req2)
        req2.wait_grammar()
        tool_call = tokenizer.backend.token_to_id("<tool_call>")
        row = manager.grammar_bitmask([req2])[0]
        assert not int(row[tool_call >> 5]) >> (tool_call & 31) & 1  # the grammar cannot start so
    manager.clear_backend()


def test_prompt_that_ended_reasoning_is_constrained_from_the_start(tokenizer):
    reasoner = ReasoningParserManager.get_reasoning_parser("deepseek_r1")
    manager = StructuredOutputManager(tokenizer, tokenizer.vocab_size, reasoner_cls=reasoner)
    params = manager.validate(StructuredOutputsParams(regex="[0-9]+"))
    req = StructuredOutputRequest(params, prompt_token_ids=_ids(tokenizer, "<think></think>"))
    manager.grammar_init(req)
    req.wait_grammar()
    assert manager.should_constrain(req)
    assert not manager.accept_tokens(req, _ids(tokenizer, "word"))
    manager.clear_backend()
