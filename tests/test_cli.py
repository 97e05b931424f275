"""build/vllm-cli end to end on the real model: chat (one turn and interactive),
generate, --help, usage errors, and clear one-line errors for bad model paths."""

from __future__ import annotations

import json
import re
import struct
import subprocess

import pytest

pytestmark = [pytest.mark.capi, pytest.mark.slow]

STATS = re.compile(r"^\[prompt tokens: \d+, completion tokens: \d+, \d+\.\d tok/s\]$", re.M)
FLAGS = [
    "-m",
    "--model",
    "-p",
    "--prompt",
    "-s",
    "--system",
    "-n",
    "--max-tokens",
    "--temp",
    "--temperature",
    "--top-p",
    "--top-k",
    "--min-p",
    "--repeat-penalty",
    "--presence-penalty",
    "--frequency-penalty",
    "--seed",
    "--max-model-len",
    "-t",
    "--threads",
    "--grammar",
    "--grammar-file",
    "-j",
    "--json-schema",
    "-h",
    "--help",
]


@pytest.fixture(scope="module")
def cli(built, child_env):
    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(built / "vllm-cli"), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=child_env,
            timeout=300,
        )

    return run


def test_chat_one_turn_answers_paris(cli, model_path):
    run = cli("chat", "-m", model_path, "--prompt", "What is the capital of France?", "-n", "32")
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout
    assert len(STATS.findall(run.stderr)) == 1, run.stderr


def test_chat_interactive_two_turns(cli, model_path):
    turns = "What is the capital of France?\n\nAnd what is 2+2?\n/exit\nnot read\n"
    run = cli("chat", "-m", model_path, "-n", "24", "-s", 'Answer "briefly".', stdin=turns)
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout
    assert len(STATS.findall(run.stderr)) == 2, run.stderr


def test_generate_streams_a_completion(cli, model_path):
    run = cli(
        "generate",
        "-m",
        model_path,
        "-p",
        "The capital of France is",
        "-n",
        "4",
        "--temp",
        "0.8",
        "--top-p",
        "0.9",
        "--top-k",
        "40",
        "--seed",
        "7",
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()
    stats = STATS.findall(run.stderr)
    assert len(stats) == 1 and "completion tokens: 4," in stats[0], run.stderr


def test_penalties_and_min_p_reach_the_engine(cli, model_path):
    """llama.cpp's flag names (--repeat-penalty, --presence-penalty, --frequency-penalty,
    --min-p) as vLLM's SamplingParams: greedy text equal to the engine's with the same
    values (oracle: LLMEngine), and different from the text without them."""
    from libvllm.engine.config import EngineConfig
    from libvllm.engine.llm_engine import LLMEngine
    from libvllm.engine.sampling_params import SamplingParams

    prompt = "one two three one two three one two three one two"
    penalties = {"repetition_penalty": 1.8, "presence_penalty": 0.8, "frequency_penalty": 0.6,
                 "min_p": 0.05}
    engine = LLMEngine.from_config(EngineConfig(model_path, device="cpu", max_model_len=256))
    try:
        want = {}
        for name, extra in (("plain", {}), ("penalised", penalties)):
            engine.add_request(name, prompt, SamplingParams(temperature=0, max_tokens=10,
                                                            **extra))
        while engine.has_unfinished_requests():
            want.update({o.request_id: o.outputs[0].text for o in engine.step() if o.finished})
    finally:
        engine.shutdown()
    assert want["plain"] != want["penalised"]
    run = cli("generate", "-m", model_path, "-p", prompt, "-n", "10", "--repeat-penalty",
              "1.8", "--presence-penalty", "0.8", "--frequency-penalty", "0.6", "--min-p",
              "0.05")
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip("\n") == want["penalised"]


@pytest.mark.parametrize("flag, value, message", [
    ("--min-p", "2", "min_p must be in [0, 1], got 2.0."),
    ("--presence-penalty", "3", "presence_penalty must be in [-2, 2], got 3.0."),
    ("--frequency-penalty", "-3", "frequency_penalty must be in [-2, 2], got -3.0."),
    ("--repeat-penalty", "0", "repetition_penalty must be greater than zero, got 0.0."),
])
def test_each_sampling_flag_reaches_its_field(cli, model_path, flag, value, message):
    """Each flag lands in its own vllm_sampling_params field: the engine's message names it."""
    run = cli("chat", "-m", model_path, "-p", "Hi", flag, value)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == f"vllm-cli: error: {message}"


def test_help_lists_every_flag(cli):
    run = cli("--help")
    assert run.returncode == 0
    for flag in FLAGS:
        assert re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", run.stdout, re.M), flag


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["chat"],
        ["serve", "-m", "x"],
        ["chat", "-m", "x", "--bogus"],
        ["chat", "-m"],
        ["generate", "-m", "x"],
        ["chat", "-m", "x", "-n", "many"],
        ["chat", "-m", "x", "--grammar", "a", "-j", "{}"],
        ["chat", "-m", "x", "--grammar-file", "/nonexistent/g.gbnf"],
    ],
)
def test_usage_errors_exit_2(cli, args):
    run = cli(*args)
    assert run.returncode == 2
    assert "error:" in run.stderr and "--help" in run.stderr


def test_library_error_exits_1(cli, model_path):
    run = cli("chat", "-m", model_path, "-p", "Hi", "--temp", "5")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "vllm-cli: error: temperature must be in [0, 2], got 5.0."
    )


def test_grammar_and_json_schema_constrain_the_answer(cli, model_path, tmp_path):
    """llama.cpp's --grammar-file / --json-schema: the answer matches the grammar (oracle:
    an equivalent Python regex) or parses as JSON with the schema's required key; a
    malformed grammar is the library's error, exit 1. The --json-schema run reads its one
    message from stdin with no /exit: chat also ends at end of input (exit 0, one turn)."""
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text('# yes or no, then a reason\n'
                       'root ::= ("Yes" | "No") ", " [a-z ]{1,20} "."\n')
    run = cli("chat", "-m", model_path, "-p", "Is Paris in France?", "--grammar-file",
              str(grammar))
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(r"(Yes|No), [a-z ]{1,20}\.\n", run.stdout), run.stdout
    schema = '{"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},' \
        ' "required": ["city"], "additionalProperties": false}'
    run = cli("chat", "-m", model_path, "-j", schema, "-n", "40", stdin="Name a city.\n")
    assert run.returncode == 0, run.stderr
    assert len(STATS.findall(run.stderr)) == 1, run.stderr
    assert set(json.loads(run.stdout)) == {"city"}
    run = cli("chat", "-m", model_path, "-p", "Hi", "--grammar", "root ::= ((")
    assert run.returncode == 1 and "Invalid grammar specification" in run.stderr


def _truncated(model: str, path) -> None:
    with open(model, "rb") as f:
        path.write_bytes(f.read(1 << 20))


def _bad_magic(model: str, path) -> None:
    _truncated(model, path)
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))


def _huge_tensor_count(model: str, path) -> None:
    _truncated(model, path)
    data = bytearray(path.read_bytes())
    data[8:16] = struct.pack("<Q", 1 << 62)  # after magic and version
    path.write_bytes(bytes(data))


def _dir_without_model(model: str, path) -> None:
    path.mkdir()
    (path / "README.txt").write_text("no model here\n")


@pytest.mark.parametrize(
    "make_bad",
    [
        None,
        "empty_dir",
        _dir_without_model,
        _truncated,
        _bad_magic,
        _huge_tensor_count,
    ],
    ids=["missing", "empty_dir", "dir_without_model", "truncated", "bad_magic", "huge_count"],
)
def test_bad_model_is_a_one_line_error(cli, model_path, tmp_path, make_bad):
    bad = tmp_path / "bad.gguf"
    if make_bad == "empty_dir":
        bad.mkdir()
    elif make_bad is not None:
        make_bad(model_path, bad)
    run = cli("chat", "-m", str(bad), "-p", "Hi")
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.startswith("vllm-cli: error: ") and run.stderr.count("\n") == 1, run.stderr
    assert "Traceback" not in run.stderr
