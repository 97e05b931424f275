"""The typed structured-output params of vllm.h 0.3 and the parser settings of the engine
params reach the engine, through build/libvllm.so loaded into this process.

Oracles: the constraint itself (json.loads + jsonschema for a schema, re.fullmatch for a
regex, membership for a choice, a Python regex equivalent to a GBNF grammar), vLLM's
validation (a malformed schema is VLLM_ERR_INVALID_ARGUMENT with the backend's reason, and
the engine serves the next request), the struct_size contract (a 0.2-sized struct has no
constraint), and the engine-params checks of vLLM's serve flags. Also examples/c/
json_schema.c, built and run as a user would, on one seed (a process and engine a run;
the schema holding over many sampled runs is tests/test_openai_structured.py's check).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest

from tests.test_capi_stream import PROMPT, open_library

pytestmark = [pytest.mark.capi, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
api = pytest.fixture(scope="module")(open_library)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine(api, model_path):
    e = api.create(model_path)
    yield e
    api.lib.vllm_engine_free(e)


def _sampled(api, keep, **fields):
    sp = api.ffi.new("vllm_sampling_params *")
    api.lib.vllm_sampling_params_init(sp, api.ffi.sizeof(sp[0]))
    sp.max_tokens, sp.temperature, sp.seed, sp.has_seed = 60, 1.0, 7, 1
    for name, value in fields.items():
        if name == "choice":
            arr = api.ffi.new("const char *[]", [api.ffi.new("char[]", w.encode())
                                                 for w in value])
            keep.append([arr] + [arr[i] for i in range(len(value))])
            sp.choice, sp.n_choice = arr, len(value)
        elif isinstance(value, str):
            keep.append(api.ffi.new("char[]", value.encode()))
            setattr(sp, name, keep[-1])
        else:
            setattr(sp, name, value)
    return sp


def test_each_typed_constraint_holds(api, engine):
    keep = []
    text = api.step_text(engine, "schema", _sampled(api, keep, json_schema=json.dumps(SCHEMA)))
    jsonschema.validate(json.loads(text), SCHEMA)
    assert isinstance(json.loads(api.step_text(engine, "object", _sampled(
        api, keep, json_object=1, max_tokens=120))), dict)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", api.step_text(engine, "regex", _sampled(
        api, keep, regex=r"[0-9]{3}-[a-z]{2}")))
    assert api.step_text(engine, "choice", _sampled(
        api, keep, choice=["red", "green", "blue"])) in ("red", "green", "blue")
    gbnf = 'root ::= answer " " digit\nanswer ::= "yes" | "no"\ndigit ::= [0-9]\n'
    assert re.fullmatch(r"(yes|no) [0-9]", api.step_text(engine, "gbnf", _sampled(
        api, keep, grammar=gbnf)))


def test_invalid_constraints_fail_the_add_and_the_engine_goes_on(api, engine):
    lib, ffi, keep = api.lib, api.ffi, []
    for fields, reason in (({"json_schema": "{not json"}, "Invalid JSON grammar"),
                           ({"regex": "(unclosed"}, "regex"),
                           ({"grammar": "root ::= (("}, "grammar"),
                           ({"regex": "a+", "choice": ["a"]}, "only use one kind")):
        sp = _sampled(api, keep, **fields)
        status = lib.vllm_request_add(engine, b"bad", PROMPT.encode(), ffi.NULL, 0, sp)
        assert status == lib.VLLM_ERR_INVALID_ARGUMENT, fields
        assert reason in api.error(), (fields, api.error())
    sp = _sampled(api, keep, choice=["a"])
    sp.n_choice, sp.choice = 2, ffi.NULL
    assert lib.vllm_request_add(engine, b"null", PROMPT.encode(), ffi.NULL, 0, sp) == \
        lib.VLLM_ERR_INVALID_ARGUMENT and "array pointer is NULL" in api.error()
    assert api.step_text(engine, "after", _sampled(api, keep, regex="ok")) == "ok"


def test_a_v0_2_sized_struct_has_no_constraint(api, engine):
    keep = []
    sp = _sampled(api, keep, regex="zzz", max_tokens=8)
    sp.struct_size = api.ffi.offsetof("vllm_sampling_params", "json_schema")
    unconstrained = _sampled(api, keep, max_tokens=8)
    assert api.step_text(engine, "v02", sp) == api.step_text(engine, "v03", unconstrained)


@pytest.mark.parametrize("fields, reason", [
    ({"tool_call_parser": "nope"}, "invalid tool_call_parser 'nope'"),
    ({"reasoning_parser": "nope"}, "invalid reasoning_parser 'nope'"),
    ({"enable_auto_tool_choice": 1}, "--enable-auto-tool-choice requires --tool-call-parser"),
    ({"structured_outputs_backend": "outlines"}, "'outlines' structured outputs backend"),
    ({"reasoning_parser": "deepseek_r1"}, "could not locate think start/end tokens"),
    ({"tool_strict_level": "nope"}, "Unknown tool strict level 'nope'"),
])
def test_engine_params_parsers_are_checked(api, model_path, fields, reason):
    p, _keep = api.params(**fields)
    out = api.ffi.new("vllm_engine **")
    assert api.lib.vllm_engine_create(model_path.encode(), p, out) != api.lib.VLLM_OK
    assert reason in api.error() and out[0] == api.ffi.NULL


def test_json_schema_c_example(compile_c, child_env, model_path):
    exe = compile_c(ROOT / "examples/c/json_schema.c")
    source = (ROOT / "examples/c/json_schema.c").read_text()
    schema_c = re.search(r"SCHEMA =\n(.*?);\n", source, re.S).group(1)
    schema = json.loads("".join(re.findall(r'"((?:[^"\\]|\\.)*)"', schema_c))
                        .encode().decode("unicode_escape"))
    run = subprocess.run([exe, model_path, "Describe a person as JSON.", "1"],
                         capture_output=True, text=True, env=child_env, timeout=300)
    assert run.returncode == 0, run.stderr
    jsonschema.validate(json.loads(run.stdout), schema)
