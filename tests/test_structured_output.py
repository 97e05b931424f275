"""Structured outputs without the model: parameters, validation and `auto` backend choice,
xgrammar's unsupported-feature detection, the guidance backend, per-request matchers, the
compile deadline and cache, and applying the packed bitmask to a logits batch.

Oracles: vLLM 0.33's expected messages / backends / accept decisions, copied from the tests
this file ports (tests/v1/structured_output/test_validation.py, test_backend_xgrammar.py,
test_backend_guidance.py, test_request.py, test_regex_compilation_timeout.py); xgrammar's
own `_is_grammar_accept_string`; for the bitmask, a per-token Python unpack of the bits.
The tokenizer is the default model's (GGUF), upstream uses gpt2's.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future

import pytest
import torch
from xgrammar import Grammar
from xgrammar.testing import _is_grammar_accept_string

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.structured_output import (
    StructuredOutputManager,
    StructuredOutputRequest,
    StructuredOutputsConfig,
    StructuredOutputsParams,
)
from libvllm.engine.structured_output.backend_guidance import (
    GuidanceBackend,
    process_for_additional_properties,
)
from libvllm.engine.structured_output.backend_types import StructuredOutputOptions
from libvllm.engine.structured_output.backend_xgrammar import (
    XgrammarBackend,
    has_xgrammar_unsupported_json_features,
    validate_xgrammar_grammar,
)
from libvllm.engine.structured_output.json_nesting import (
    MAX_STRUCTURED_OUTPUT_JSON_NESTING,
    STRUCTURAL_TAG_WRAPPER_NESTING,
)
from libvllm.engine.structured_output.response_format import structured_outputs_from_response_format
from libvllm.engine.structured_output.utils import (
    apply_grammar_bitmask,
    choice_as_grammar,
    compile_regex_with_timeout,
)
from libvllm.engine.structured_output.validation import validate_structured_outputs


@pytest.fixture(scope="module")
def tokenizer(gguf_tokenizer):
    return gguf_tokenizer


@pytest.fixture(scope="module")
def manager(tokenizer):
    mgr = StructuredOutputManager(tokenizer, tokenizer.vocab_size)
    yield mgr
    mgr.clear_backend()


def _validate(backend: str = "auto", **constraint) -> StructuredOutputsParams:
    params = StructuredOutputsParams(**constraint)
    return validate_structured_outputs(params, StructuredOutputsConfig(backend=backend))


# ---- StructuredOutputsParams (vllm/sampling_params.py) -------------------------------------


def test_exactly_one_constraint():
    with pytest.raises(InvalidArgumentError, match="only use one kind .* multiple"):
        StructuredOutputsParams(json={}, regex="a")
    with pytest.raises(InvalidArgumentError, match="must use one kind .* none"):
        StructuredOutputsParams()
    with pytest.raises(InvalidArgumentError, match="structured_outputs.regex must be a str"):
        StructuredOutputsParams(regex=3)
    with pytest.raises(InvalidArgumentError, match="choice must be a list of strings"):
        StructuredOutputsParams(choice=["a", 1])


# ---- test_validation.py ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "constraint, match",
    [
        ({"json_object": False}, "json_object must be True"),
        ({"json": ""}, "json cannot be an empty string"),
        ({"structural_tag": ""}, "structural_tag cannot be an empty string"),
        ({"choice": []}, r"Choice '\[\]' cannot be an empty list"),
        ({"grammar": "  "}, "grammar cannot be an empty string"),
    ],
)
def test_degenerate_structured_outputs_rejected(constraint, match):
    with pytest.raises(InvalidArgumentError, match=match):
        _validate(**constraint)


@pytest.mark.parametrize("regex", ["\x00", "\x00\x01\x02\x1f", "[0-9]\x00"])
def test_regex_with_nul_byte_rejected(regex):
    with pytest.raises(InvalidArgumentError, match="NUL"):
        _validate(regex=regex)
    with pytest.raises(ValueError, match="NUL"):
        validate_xgrammar_grammar(StructuredOutputsParams(regex=regex))


def _nested_array_schema(levels: int) -> str:
    wrappers = levels - 1
    return '{"type": "array", "items": ' * wrappers + '{"type": "string"}' + "}" * wrappers


def _nested_array_dict(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels - 1):  # built iteratively: json.loads would hit the recursion limit
        schema = {"type": "array", "items": schema}
    return schema


def _structural_tag(schema: str) -> str:
    return (
        '{"type": "structural_tag", "format": {"type": "json_schema", '
        f'"json_schema": {schema}}}}}'
    )


@pytest.mark.parametrize("backend", ["auto", "xgrammar", "guidance"])
@pytest.mark.parametrize(
    "constraint",
    [
        {"json": _nested_array_schema(MAX_STRUCTURED_OUTPUT_JSON_NESTING + 1)},
        {"json": _nested_array_dict(2_000)},
        {"json": _nested_array_schema(200_000)},
        {
            "structural_tag": _structural_tag(
                _nested_array_schema(
                    MAX_STRUCTURED_OUTPUT_JSON_NESTING + STRUCTURAL_TAG_WRAPPER_NESTING
                )
            )
        },
    ],
    ids=["json-str-over-limit", "json-dict-deep", "json-str-very-deep", "structural-tag"],
)
def test_deeply_nested_schema_rejected(constraint, backend):
    with pytest.raises(InvalidArgumentError, match="nested too deeply"):
        _validate(backend, **constraint)


@pytest.mark.parametrize("field", ["json", "structural_tag"])
def test_schema_at_nesting_limit_accepted(field):
    schema = _nested_array_schema(MAX_STRUCTURED_OUTPUT_JSON_NESTING)
    value = _structural_tag(schema) if field == "structural_tag" else schema
    assert _validate(**{field: value})._backend == "xgrammar"


INVALID_JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "str"}}}


@pytest.mark.parametrize(
    "backend, constraint",
    [
        ("xgrammar", {"json": INVALID_JSON_SCHEMA}),
        ("auto", {"json": INVALID_JSON_SCHEMA}),
        ("auto", {"json": '{"type": '}),
        ("xgrammar", {"grammar": "not a grammar"}),
        ("guidance", {"grammar": "not a grammar"}),
        ("auto", {"grammar": "root ::= undefined_rule"}),
        ("auto", {"regex": "("}),
        ("guidance", {"structural_tag": '{"nope": 1}'}),
    ],
)
def test_unsupported_grammar_is_a_client_error(backend, constraint):
    with pytest.raises(InvalidArgumentError):
        _validate(backend, **constraint)


@pytest.mark.parametrize(
    "constraint", [{"json_object": True}, {"regex": "[0-9]+"}, {"regex": ""}, {"json": {}}]
)
def test_supported_spec_is_not_rejected(constraint):
    assert _validate("xgrammar", **constraint)._backend == "xgrammar"


def test_unhandled_spec_is_a_validation_error():
    with pytest.raises(InvalidArgumentError, match="does not support this"):
        validate_xgrammar_grammar(StructuredOutputsParams(json_object=False))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}},
        {"type": "object", "properties": {"n": {"type": ["number", "null"], "multipleOf": 3}}},
        {"type": ["string", "null"], "pattern": "^a+$", "maxLength": 2},
    ],
)
def test_auto_backend_falls_back_to_guidance(schema):
    params = _validate(json=schema)
    assert (params._backend, params._backend_was_auto) == ("guidance", True)


def test_auto_backend_fails_loudly_when_no_backend_fits():
    # upstream falls back to outlines here, which we do not ship
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "patternProperties": {"^a$": {"type": "string"}},
    }
    with pytest.raises(InvalidArgumentError, match="No compatible structured output backend"):
        _validate(json=schema)


def test_request_level_backend_selection_rejected():
    params = _validate("guidance", regex="a+")
    with pytest.raises(InvalidArgumentError, match="Request-level structured output backend"):
        validate_structured_outputs(params, StructuredOutputsConfig(backend="xgrammar"))
    auto = _validate(json={"type": "integer", "multipleOf": 3})
    assert validate_structured_outputs(auto, StructuredOutputsConfig())._backend == "guidance"


def test_config_validation():
    with pytest.raises(InvalidArgumentError, match="disable_any_whitespace is only supported"):
        StructuredOutputsConfig(disable_any_whitespace=True)
    with pytest.raises(InvalidArgumentError, match="only supported for the guidance backend"):
        StructuredOutputsConfig(backend="xgrammar", disable_additional_properties=True)


# ---- test_backend_xgrammar.py ------------------------------------------------------------------

UNSUPPORTED_SCHEMAS = [
    {"type": "number", "multipleOf": 120},
    {"Even": {"type": "integer", "multipleOf": 2}},
    {"type": "array", "uniqueItems": True},
    {"type": "array", "contains": {"type": "string"}},
    {"type": "array", "minContains": 1},
    {"type": "string", "format": "non_existing_format"},
    {"type": "string", "pattern": "^a+$", "maxLength": 2},
    {"type": "string", "format": "email", "maxLength": 10},
    {
        "type": "object",
        "propertyNames": {"pattern": "^grade_[0-9]$"},
        "patternProperties": {"^grade_[0-9]+$": {"type": "integer"}},
    },
    {"type": "object", "propertyNames": {"pattern": "^a+$", "maxLength": 2}},
    {"type": "object", "propertyNames": {"enum": ["good"]}, "properties": {"Bad": {}}},
    {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "unevaluatedProperties": False},
    {
        "type": "object",
        "patternProperties": {"^x$": {"type": "integer"}},
        "properties": {"x": {"type": "string"}},
    },
    {
        "type": "object",
        "patternProperties": {"^a[a-z]*$": {"type": "string"}, "^[a-z]*z$": {"type": "integer"}},
    },
    {"allOf": [{"type": "string"}, {"enum": ["yes", "no"]}]},
    {"type": "object", "properties": {"s": {"allOf": [{"type": "string"}, {"enum": ["y"]}]}}},
    {"type": ["number"], "multipleOf": 3},
    {"type": ["array", "null"], "items": {"type": "integer"}, "uniqueItems": True},
]
SUPPORTED_SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "email": {"type": "string", "format": "email"},
            "car_brand": {"type": "string", "pattern": "^[a-zA-Z]+$"},
            "short": {"type": "string", "maxLength": 50},
            "year": {"type": "integer", "exclusiveMinimum": 1900, "exclusiveMaximum": 2100},
        },
        "minProperties": 1,
    },
    {"type": "object", "patternProperties": {"^grade_[0-9]+$": {"type": "integer"}}},
    {"type": "object", "propertyNames": {"pattern": "^[a-z_]+$"}},
    {"allOf": [{"type": "string"}]},
    {"allOf": []},
    {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    {"oneOf": [{"type": "integer"}, {"type": "string", "enum": ["auto", "none"]}]},
    {"type": "object", "properties": {"allOf": {"type": "string"}}},
    {"type": ["string", "null"]},
    {"type": ["object", "null"], "patternProperties": {"^S": {"type": "string"}}},
]


@pytest.mark.parametrize("schema", UNSUPPORTED_SCHEMAS)
def test_unsupported_json_features(schema):
    assert has_xgrammar_unsupported_json_features(schema)


@pytest.mark.parametrize("schema", SUPPORTED_SCHEMAS)
def test_supported_json_features(schema):
    assert not has_xgrammar_unsupported_json_features(schema)


@pytest.mark.parametrize("codepoint", [0x00, 0x0A, 0x1F, 0x7F])
def test_choice_as_grammar_preserves_control_characters(codepoint):
    choice = f"a{chr(codepoint)}f"
    grammar = Grammar.from_ebnf(choice_as_grammar([choice]))
    assert _is_grammar_accept_string(grammar, choice)
    assert not _is_grammar_accept_string(grammar, "af")
    assert not _is_grammar_accept_string(grammar, f"a\\u{codepoint:04x}f")


@pytest.mark.parametrize(
    "choice, other",
    [
        (r"a\nf", "a\nf"),
        ('a quote " and a backslash \\', 'a quote " and a backslash '),
        ("café", "cafe"),
        ("😀", "😁"),
    ],
)
def test_choice_as_grammar_preserves_literal_choices(choice, other):
    grammar = Grammar.from_ebnf(choice_as_grammar(["yes", choice]))
    assert _is_grammar_accept_string(grammar, choice)
    assert not _is_grammar_accept_string(grammar, other)
    assert not _is_grammar_accept_string(grammar, choice + "extra")


def test_validate_xgrammar_rewrites_choice_into_grammar():
    params = StructuredOutputsParams(choice=["yes", "no\nplease"])
    validate_xgrammar_grammar(params)
    assert params.choice is None
    grammar = Grammar.from_ebnf(params.grammar)
    assert _is_grammar_accept_string(grammar, "no\nplease")
    assert not _is_grammar_accept_string(grammar, r"no\nplease")


def _accepts(grammar, tokenizer, text: str) -> bool:
    return grammar.accept_tokens("r", tokenizer.encode(text, add_special_tokens=False))


def test_disable_any_whitespace(tokenizer):
    def backend(disable: bool) -> XgrammarBackend:
        config = StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=disable)
        return XgrammarBackend(config, tokenizer, tokenizer.vocab_size)

    loose, strict = backend(False), backend(True)
    for text in ('{"no_space":"x"}', '{"space": true}', '{"a":1, "b":2}'):
        assert _accepts(
            loose.compile_grammar(StructuredOutputOptions.JSON_OBJECT, ""), tokenizer, text
        )
    grammar = strict.compile_grammar(StructuredOutputOptions.JSON_OBJECT, "")
    assert _accepts(grammar, tokenizer, '{"no_space":"x"}')
    grammar = strict.compile_grammar(StructuredOutputOptions.JSON_OBJECT, "")
    assert not _accepts(grammar, tokenizer, '{"space": true}')


# ---- test_backend_guidance.py ------------------------------------------------------------------


@pytest.fixture(scope="module")
def guidance(tokenizer):
    return GuidanceBackend(
        StructuredOutputsConfig(backend="guidance"), tokenizer, tokenizer.vocab_size
    )


def test_backend_guidance_rejects_grammar_matcher_cannot_build(guidance):
    with pytest.raises(ValueError, match="Grammar error: .*uniqueItems"):
        guidance.compile_grammar(
            StructuredOutputOptions.JSON, json.dumps({"type": "array", "uniqueItems": True})
        )


def test_backend_guidance_rollback_terminated(guidance, tokenizer):
    grammar = guidance.compile_grammar(StructuredOutputOptions.JSON, '{"type": "object"}')
    prompt = tokenizer.encode('{"a": "b"}', add_special_tokens=False)
    dummy_wrong = tokenizer.encode('{"a"}', add_special_tokens=False)
    eos = tokenizer.eos_token_id
    assert len(prompt) > 1
    assert grammar.accept_tokens("", prompt) and not grammar.is_terminated()
    assert grammar.accept_tokens("", [eos]) and grammar.is_terminated()
    assert grammar.accept_tokens("", dummy_wrong)  # anything goes once terminated
    grammar.rollback(len(prompt) - 1)  # from '}' (not EOS), as upstream
    assert not grammar.is_terminated()
    assert grammar.validate_tokens([eos]) == []
    assert grammar.validate_tokens(dummy_wrong) != dummy_wrong
    assert grammar.accept_tokens("", prompt[1:]) and not grammar.is_terminated()
    assert grammar.accept_tokens("", [eos]) and grammar.is_terminated()
    grammar.rollback(0)
    grammar.rollback(-1)
    assert grammar.is_terminated()


def test_process_for_additional_properties_preserves_literals():
    feature = {"type": "Feature", "properties": {"name": "HQ"}, "patternProperties": {"^x": "y"}}
    schema = {
        "type": "object",
        "properties": {
            "const_field": {"const": feature},
            "enum_field": {"enum": [feature]},
            "properties": {"type": "string"},
            "const": {"type": "object", "properties": {"id": {"type": "integer"}}},
        },
        "$defs": {"item": {"type": "object", "properties": {"label": {"type": "string"}}}},
    }
    processed = process_for_additional_properties(schema)
    assert processed["additionalProperties"] is False
    assert processed["$defs"]["item"]["additionalProperties"] is False
    assert processed["properties"]["const"]["additionalProperties"] is False
    assert "additionalProperties" not in processed["properties"]
    assert processed["properties"]["const_field"]["const"] == feature
    assert processed["properties"]["enum_field"]["enum"] == [feature]
    assert "additionalProperties" not in schema  # the request's schema is left alone


# ---- test_request.py / test_regex_compilation_timeout.py --------------------------------------


def test_pending_grammar_future_is_not_ready():
    req = StructuredOutputRequest(StructuredOutputsParams(regex="a+"))
    req.grammar = Future()
    assert not req.is_grammar_ready
    assert req.grammar is None


def test_grammar_compile_raising_timeout_error_is_a_failure():
    fut: Future = Future()
    fut.set_exception(TimeoutError("compiler timed out"))
    req = StructuredOutputRequest(StructuredOutputsParams(regex="a+"))
    req.grammar = fut
    assert req.is_grammar_ready
    assert isinstance(req.grammar, TimeoutError)


def test_compile_regex_with_timeout():
    assert compile_regex_with_timeout(lambda p: "compiled", "[a-z]+", 5) == "compiled"
    assert compile_regex_with_timeout(lambda p: "no_timeout", r"(a+)+b", 0) == "no_timeout"

    def failing(pattern):
        raise RuntimeError("compilation failed")

    with pytest.raises(RuntimeError, match="compilation failed"):
        compile_regex_with_timeout(failing, "bad", 5)
    with pytest.raises(InvalidArgumentError, match=r"timed out.*\(a\+\)\+b"):
        compile_regex_with_timeout(lambda p: time.sleep(2), r"(a+)+b", 0.2)


# ---- response_format mapping (vllm/entrypoints/generate/base/protocol.py) ---------------------


def test_structured_outputs_from_response_format():
    schema = {"type": "object"}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert structured_outputs_from_response_format(None, rf).json == schema
    assert structured_outputs_from_response_format(None, {"type": "json_object"}).json_object
    assert structured_outputs_from_response_format(None, {"type": "text"}) is None
    assert structured_outputs_from_response_format({"regex": "a"}, None).regex == "a"
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}
    assert json.loads(structured_outputs_from_response_format(None, tag).structural_tag) == tag
    with pytest.raises(InvalidArgumentError, match="'json_schema' field must be provided"):
        structured_outputs_from_response_format(None, {"type": "json_schema"})
    with pytest.raises(InvalidArgumentError, match="only use one kind"):
        structured_outputs_from_response_format({"regex": "a"}, {"type": "json_object"})
    with pytest.raises(InvalidArgumentError, match="unknown fields"):
        structured_outputs_from_response_format({"regexp": "a"}, None)


# ---- the manager: matchers, cache, deadline ----------------------------------------------------


def _compiled(manager, **constraint) -> StructuredOutputRequest:
    params = manager.validate(StructuredOutputsParams(**constraint))
    req = StructuredOutputRequest(params, request_id="r", stop_token_ids={2})
    manager.grammar_init(req)
    req.wait_grammar()
    return req


def test_matcher_accept_rollback_terminate(manager, tokenizer):
    req = _compiled(manager, regex="[0-9]{3}")
    grammar, eos = req.grammar, tokenizer.eos_token_id
    digits = tokenizer.encode("123", add_special_tokens=False)
    letter = tokenizer.encode("x", add_special_tokens=False)
    assert not manager.accept_tokens(req, letter)  # rejected: the request must fail
    assert manager.accept_tokens(req, digits) and not grammar.is_terminated()
    allowed = manager.grammar_bitmask([req])
    assert [t for t in range(tokenizer.vocab_size) if allowed[0, t >> 5] >> (t & 31) & 1] == [eos]
    assert manager.accept_tokens(req, [eos]) and grammar.is_terminated()
    grammar.rollback(1)
    assert not grammar.is_terminated() and grammar.validate_tokens([eos]) == [eos]


def test_compiled_grammar_cache(manager):
    _compiled(manager, regex="[a-c]{2,5}")
    backend = manager.backends["xgrammar"]  # xgrammar's own cache, as vLLM: a hit adds nothing
    cached = backend.compiler.get_cache_size_bytes()
    first, second = _compiled(manager, regex="[a-c]{2,5}"), _compiled(manager, regex="[a-c]{2,5}")
    assert cached > 0 and backend.compiler.get_cache_size_bytes() == cached
    assert first.grammar is not second.grammar  # a fresh matcher each time


def test_compile_deadline_fails_only_that_request(tokenizer, monkeypatch):
    config = StructuredOutputsConfig(grammar_compilation_timeout_s=0.3)
    manager = StructuredOutputManager(tokenizer, tokenizer.vocab_size, config)
    slow = manager.validate(StructuredOutputsParams(regex="slow"))
    _compiled(manager, regex="warm")  # the backend exists
    backend = manager.backends["xgrammar"]
    real = backend.compile_grammar
    monkeypatch.setattr(
        backend, "compile_grammar", lambda k, s, **kw: time.sleep(1.5) or real(k, s, **kw)
    )
    req = StructuredOutputRequest(slow, request_id="slow")
    manager.grammar_init(req)
    stuck_executor = manager.executor
    with pytest.raises(InvalidArgumentError, match="Grammar compilation timed out"):
        req.wait_grammar()
    assert req.is_grammar_ready and isinstance(req.grammar, InvalidArgumentError)
    monkeypatch.setattr(backend, "compile_grammar", real)
    assert manager.executor is not stuck_executor
    assert _compiled(manager, regex="next").grammar is not None  # nothing else broke
    manager.clear_backend()


def test_guidance_and_xgrammar_requests_share_a_batch(manager, tokenizer):
    xgr_req = _compiled(manager, choice=["yes", "no"])
    llg_req = _compiled(manager, json={"type": "integer", "multipleOf": 7})
    assert {xgr_req.params._backend, llg_req.params._backend} == {"xgrammar", "guidance"}
    bitmask = manager.grammar_bitmask([xgr_req, llg_req])
    assert bitmask.shape == (2, (tokenizer.vocab_size + 31) // 32)
    assert manager.accept_tokens(llg_req, tokenizer.encode("14", add_special_tokens=False))
    assert not manager.accept_tokens(llg_req, tokenizer.encode("x", add_special_tokens=False))


# ---- apply_grammar_bitmask ------------------------------------------------------------------


def _reference_mask(logits, bitmask, rows):
    out = logits.clone()
    for r, row in enumerate(rows):
        for t in range(logits.shape[1]):
            if not (int(bitmask[r, t >> 5]) >> (t & 31)) & 1:
                out[row, t] = float("-inf")
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("rows", [None, [2, 0], torch.tensor([3])])
def test_apply_grammar_bitmask(dtype, rows):
    gen = torch.Generator().manual_seed(0)
    vocab, batch = 100, 4
    n = batch if rows is None else len(rows)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (n, 4), generator=gen, dtype=torch.int32)
    logits = torch.randn(batch, vocab, generator=gen).to(dtype)
    expected = _reference_mask(logits, bitmask, range(batch) if rows is None else rows)
    apply_grammar_bitmask(logits, bitmask, rows)
    assert torch.equal(logits, expected)


# A JSON grammar written the way llama.cpp's grammars/json.gbnf is (multi-line rules, comments,
# `{m,n}` repetition, `\x` escapes, an empty first alternative that xgrammar does not parse).
LLAMA_CPP_STYLE_JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""


@pytest.mark.parametrize(
    "grammar, backend",
    [
        (LLAMA_CPP_STYLE_JSON_GBNF, "guidance"),
        (LLAMA_CPP_STYLE_JSON_GBNF.replace('ws ::= | " "', 'ws ::= "" | " "'), "xgrammar"),
    ],
    ids=["empty-alternative", "xgrammar-spelling"],
)
def test_llama_cpp_style_gbnf_is_accepted(manager, tokenizer, grammar, backend):
    req = _compiled(manager, grammar=grammar)
    assert req.params._backend == backend
    sample = '{"a": [1, -2.5e3, "x\\n"], "b": {"c": null}}'
    assert manager.accept_tokens(req, tokenizer.encode(sample, add_special_tokens=False))
    assert manager.accept_tokens(req, [tokenizer.eos_token_id]) and req.grammar.is_terminated()
    bad = _compiled(manager, grammar=grammar)
    assert not manager.accept_tokens(bad, tokenizer.encode('{"a": }', add_special_tokens=False))
