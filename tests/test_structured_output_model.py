"""Structured outputs on the default model: a JSON schema over 20 seeded sampling runs, a
regex, a choice, a GBNF grammar in llama.cpp's grammars/ style, a json_object and a schema
only llguidance honours (`auto` fallback), all decoded in one batch with the grammar bitmask
applied to the logits batch and every matcher advanced after sampling; malformed
constraints are InvalidArgumentError and the engine keeps serving.

Oracles: the constraints themselves - json.loads + jsonschema.validate, re.fullmatch,
membership, an equivalent Python regex for the grammar, `% 7 == 0` for multipleOf.
Mirrors the shape of vLLM 0.33 tests/v1/entrypoints/llm/test_struct_output_generate.py
(every output must satisfy its constraint), on our model and without the engine's sampler:
a test-local loop (model_loader.load_model, paged KV cache, plain softmax sampling).
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.attention import Attention, AttentionMetadata
from libvllm.engine.model_loader import load_model
from libvllm.engine.structured_output import (
    StructuredOutputManager,
    StructuredOutputRequest,
    StructuredOutputsParams,
)
from libvllm.engine.structured_output.utils import apply_grammar_bitmask
from libvllm.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.slow
BLOCK = 16
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 1, "maximum": 99},
        "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
ANSWER_GBNF = r"""
# A short answer, written the way llama.cpp's grammars/*.gbnf are
root   ::= answer " because " reason "."
answer ::= "Yes" | "No"
reason ::= [a-z]{1,10} (" " [a-z]{1,10}){0,3}
"""
ANSWER_RE = r"(Yes|No) because [a-z]{1,10}( [a-z]{1,10}){0,3}\."


@pytest.fixture(scope="module")
def engine_parts(model_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 spinning threads on a shared 2-core box cost 10x CPU
    model, cfg, reader = load_model(model_path)
    tokenizer = Tokenizer.from_gguf_metadata(reader.metadata)
    reader.close()
    manager = StructuredOutputManager(tokenizer, cfg.vocab_size)
    yield model, tokenizer, manager
    manager.clear_backend()
    torch.set_num_threads(threads)


def _chat(tokenizer, question: str) -> list[int]:
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(text)


class _Batch:
    """Rows sharing one prompt: the prompt is prefilled once and its KV blocks copied."""

    def __init__(self, model, n: int, max_len: int) -> None:
        self.model, self.n = model, n
        self.nblk = (max_len + BLOCK - 1) // BLOCK
        self.layers = [m for m in model.modules() if isinstance(m, Attention)]
        for layer in self.layers:  # [2, blocks, BLOCK, kv heads, head dim]
            layer.kv_cache = torch.zeros(
                2, n * self.nblk, BLOCK, layer.num_kv_heads, layer.head_size
            )
        self.block_table = torch.arange(n * self.nblk, dtype=torch.int32).view(n, self.nblk)

    def forward(self, rows: list[int], tokens: list[list[int]], start: int) -> torch.Tensor:
        """Logits [len(rows), vocab] after feeding `tokens[i]` at positions start.. of rows[i]."""
        ids, pos, slots, qsl = [], [], [], [0]
        for row, toks in zip(rows, tokens):
            ids += toks
            pos += range(start, start + len(toks))
            slots += [row * self.nblk * BLOCK + p for p in range(start, start + len(toks))]
            qsl.append(qsl[-1] + len(toks))
        seq_lens = [start + len(t) for t in tokens]
        md = AttentionMetadata(len(ids), torch.tensor(slots), qsl, seq_lens, self.block_table[rows])
        hidden = self.model(torch.tensor(ids), torch.tensor(pos), md)
        return self.model.compute_logits(hidden[[q - 1 for q in qsl[1:]]])

    def copy_prompt(self, prompt_len: int) -> None:
        used = (prompt_len + BLOCK - 1) // BLOCK
        for layer in self.layers:
            for row in range(1, self.n):
                dst = row * self.nblk
                layer.kv_cache[:, dst : dst + used] = layer.kv_cache[:, :used]


@torch.inference_mode()
def generate(model, tokenizer, manager, prompt, so_reqs, seeds, max_tokens) -> list[str]:
    """Sample every row under its grammar (seed None: greedy) until its grammar terminates."""
    n = len(so_reqs)
    batch = _Batch(model, n, len(prompt) + max_tokens)
    first = batch.forward([0], [prompt], 0)  # [1, vocab]
    batch.copy_prompt(len(prompt))
    gens = [None if s is None else torch.Generator().manual_seed(s) for s in seeds]
    logits, active = first.expand(n, -1).clone(), list(range(n))
    outputs: list[list[int]] = [[] for _ in range(n)]
    for step in range(max_tokens):
        apply_grammar_bitmask(logits, manager.grammar_bitmask([so_reqs[i] for i in active]))
        sampled = []
        for row_logits, i in zip(logits, active):
            if gens[i] is None:
                token = int(row_logits.argmax())
            else:
                probs = torch.softmax(row_logits, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=gens[i]))
            assert manager.accept_tokens(so_reqs[i], [token])
            if not so_reqs[i].grammar.is_terminated():
                outputs[i].append(token)
                sampled.append(i)
        if not sampled:
            break
        active = sampled
        logits = batch.forward(active, [[outputs[i][-1]] for i in active], len(prompt) + step)
    unfinished = [i for i in range(n) if not so_reqs[i].grammar.is_terminated()]
    assert not unfinished, f"rows {unfinished} did not finish in {max_tokens} tokens"
    return [tokenizer.decode(o) for o in outputs]


def _requests(tokenizer, manager, **constraint) -> StructuredOutputRequest:
    params = manager.validate(StructuredOutputsParams(**constraint))
    req = StructuredOutputRequest(params, stop_token_ids={tokenizer.eos_token_id})
    manager.grammar_init(req)
    req.wait_grammar(timeout=60)
    return req


def test_malformed_constraints_are_client_errors(engine_parts):
    _, _, manager = engine_parts
    bad = [
        {"json": '{"type": "object", "properties": '},
        {"json": {"type": "object", "properties": {"a": {"type": "str"}}}},
        {"regex": "[0-9"},
        {"grammar": "root ::= missing_rule"},
        {"choice": []},
    ]
    for constraint in bad:
        with pytest.raises(InvalidArgumentError):
            manager.validate(StructuredOutputsParams(**constraint))


def test_every_output_obeys_its_constraint(engine_parts):
    model, tokenizer, manager = engine_parts
    rows: list[tuple[str, StructuredOutputRequest, int | None]] = []
    for seed in range(20):
        rows.append(("json", _requests(tokenizer, manager, json=PERSON_SCHEMA), seed))
    for kind, constraint in [
        ("regex", {"regex": r"\d{3}-\d{4}"}),
        ("choice", {"choice": ["Paris", "London", "Tokyo"]}),
        ("grammar", {"grammar": ANSWER_GBNF}),
        (
            "multiple_of_7",
            {"json": {"type": "integer", "multipleOf": 7, "minimum": 0, "maximum": 999}},
        ),
    ]:
        for seed in (None, 100):
            rows.append((kind, _requests(tokenizer, manager, **constraint), seed))
    rows.append(("json_object", _requests(tokenizer, manager, json_object=True), None))
    assert rows[-2][1].params._backend == "guidance"  # multipleOf: the auto fallback

    prompt = _chat(tokenizer, "Give one person as JSON with name, age and city.")
    texts = generate(
        model, tokenizer, manager, prompt, [r[1] for r in rows], [r[2] for r in rows], max_tokens=48
    )
    for (kind, _, seed), text in zip(rows, texts):
        where = f"{kind} seed={seed}: {text!r}"
        if kind == "json":
            jsonschema.validate(json.loads(text), PERSON_SCHEMA)
        elif kind == "json_object":
            assert isinstance(json.loads(text), dict), where
        elif kind == "regex":
            assert re.fullmatch(r"\d{3}-\d{4}", text), where
        elif kind == "choice":
            assert text in ("Paris", "London", "Tokyo"), where
        elif kind == "grammar":
            assert re.fullmatch(ANSWER_RE, text), where
        else:
            assert json.loads(text) % 7 == 0, where
