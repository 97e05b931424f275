"""examples/server's token budget: `vllm serve`'s 8,192 tokens a step where the user set
none and chunked prefill is on (the library derives the LLM class's 16,384 on H100-class
GPUs, engine/resolved_config.py batch_defaults); a set value, or chunked prefill off (the
engine then takes the context length, as vLLM), passes through."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "server"))
import server  # noqa: E402


@pytest.mark.parametrize("flags, tokens", [
    ([], 8192), (["--max-num-batched-tokens", "2048"], 2048),
    (["--enable-chunked-prefill"], 8192), (["--no-enable-chunked-prefill"], None),
], ids=["default", "set", "chunked-on", "chunked-off"])
def test_server_token_budget(flags, tokens):
    fields = server.engine_fields(server.parse_args(["m.gguf", *flags]))
    assert fields["max_num_batched_tokens"] == tokens
    assert fields["max_num_seqs"] is None  # the library's device default
