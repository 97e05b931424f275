"""generation_config.json's eos_token_id list stops generation (vllm/sampling_params.py
update_from_generation_config, called by vLLM's input processor with the model's
generation config): Llama 3 Instruct directories list <|eom_id|> and <|eot_id|> there. A
GGUF's eot / eom ids do the same (llama.cpp's end-of-generation set).

Oracle: the model's own greedy tokens without the file; with it, the run ends at the first
listed token (finish_reason "stop", stop_reason that id), in process and with the core in a
child; ignore_eos keeps generating.
"""

from __future__ import annotations

import json

import gguf
import pytest
import torch

from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import ModelLoadError
from libvllm.engine.llm_engine import LLMEngine
from libvllm.engine.sampling_params import SamplingParams

transformers = pytest.importorskip("transformers")

PROMPT = [1, 17, 42, 99, 5]
TOKENS = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=128, max_position_embeddings=128)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("llama")
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    return d


def _run(model_dir, multiprocessing: bool, **sp) -> tuple[list[int], str, object]:
    engine = LLMEngine.from_config(EngineConfig(
        str(model_dir), device="cpu", max_model_len=64, skip_tokenizer_init=True,
        multiprocessing=multiprocessing))
    try:
        engine.add_request("r", PROMPT, SamplingParams(temperature=0, max_tokens=TOKENS, **sp))
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    c = out.outputs[0]
                    return list(c.token_ids), c.finish_reason, c.stop_reason
    finally:
        engine.shutdown()
    raise AssertionError("the request did not finish")


@pytest.mark.parametrize("multiprocessing", [False, True], ids=["in-process", "child-core"])
def test_generation_config_eos_ids_stop_generation(model_dir, multiprocessing):
    path = model_dir / "generation_config.json"
    path.unlink(missing_ok=True)
    greedy, reason, _ = _run(model_dir, multiprocessing)
    assert (len(greedy), reason) == (TOKENS, "length")
    k = next(i for i in range(2, TOKENS) if greedy[i] not in greedy[:i])
    unused = next(t for t in range(128) if t not in greedy)
    try:
        path.write_text(json.dumps({"eos_token_id": [unused, greedy[k]]}))
        assert _run(model_dir, multiprocessing) == (greedy[:k + 1], "stop", greedy[k])
        assert _run(model_dir, multiprocessing, ignore_eos=True) == (greedy, "length", None)
    finally:
        path.unlink()


def test_only_the_eos_ids_cross_to_the_front_end(model_dir):
    """The rest of generation_config.json is arbitrary JSON (an int past 64 bits would stop
    the child core's msgpack before READY); a huge eos id is a load error."""
    path = model_dir / "generation_config.json"
    try:
        path.write_text(json.dumps({"eos_token_id": [127], "vendor_field": 2**70}))
        tokens, _, _ = _run(model_dir, True)
        assert len(tokens) >= 1
        path.write_text(json.dumps({"eos_token_id": [2**40]}))
        with pytest.raises(ModelLoadError, match="eos_token_id"):
            _run(model_dir, False)
    finally:
        path.unlink()


def _gguf_with(tmp_path, name: str, **token_ids) -> str:
    """The tiny Llama as a GGUF twin (no vocabulary) with tokenizer.ggml.<kind>_token_id
    keys for `token_ids` (eos / eot / eom)."""
    from tests.test_models_parity import make_hf_model, write_gguf_twin

    path = tmp_path / name
    write_header = gguf.GGUFWriter.write_header_to_file

    def header(self, *args, **kw):
        for kind, token_id in token_ids.items():
            self.add_uint32(f"tokenizer.ggml.{kind}_token_id", token_id)
        return write_header(self, *args, **kw)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(gguf.GGUFWriter, "write_header_to_file", header)
        write_gguf_twin(make_hf_model("llama"), "llama", path)
    return str(path)


def test_gguf_end_of_turn_ids_stop_generation(tmp_path):
    """llama.cpp ends generation on every end-of-generation id of the file (llama-vocab.cpp
    special_eog_ids: eos, eot, eom); so does a GGUF here, through the same stop ids."""
    greedy, reason, _ = _run(_gguf_with(tmp_path, "plain.gguf"), False)
    assert (len(greedy), reason) == (TOKENS, "length")
    k = next(i for i in range(2, TOKENS) if greedy[i] not in greedy[:i])
    unused = next(t for t in range(64) if t not in greedy)
    path = _gguf_with(tmp_path, "eot.gguf", eot=greedy[k], eom=unused)
    assert _run(path, False) == (greedy[:k + 1], "stop", greedy[k])
    path = _gguf_with(tmp_path, "eos.gguf", eos=greedy[k])  # no tokenizer: eos alone stops
    assert _run(path, False) == (greedy[:k + 1], "stop", greedy[k])
    with pytest.raises(ModelLoadError, match="tokenizer.ggml.eom_token_id"):
        _run(_gguf_with(tmp_path, "bad.gguf", eom=1 << 30), False)
