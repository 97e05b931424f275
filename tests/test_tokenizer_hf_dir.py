"""engine.tokenizers (hf): Tokenizer.from_hf_dir on Hugging Face tokenizer directories.

Oracle: transformers' AutoTokenizer.from_pretrained(dir) (what vllm/tokenizers/hf.py loads) on
the same directory: ids with and without special tokens, decoded text, BOS/EOS ids, special
ids, chat templates. The directories are written here by save_pretrained of transformers'
GGUF tokenizers (a sentencepiece vocab trained in test_tokenizer_spm.py, llama- and
Gemma-shaped, and the real SmolLM2-135M byte-level vocab when present), then edited: chat
template files and keys, special tokens missing from tokenizer.json, add_bos_token, custom
code. Hostile directories (bad JSON, FIFOs, oversized files, custom code) must raise
ModelLoadError/UnsupportedError and never run a file. Mirrors vLLM 0.33
tests/tokenizers_/test_hf.py (load a tokenizer directory, compare with AutoTokenizer) and
transformers' chat-template file precedence (tokenization_utils_base._from_pretrained).
"""

import json
import os
import shutil
from pathlib import Path

import pytest
from test_tokenizer_spm import CORPUS, train_sentencepiece, write_spm_gguf

from libvllm.engine.errors import ModelLoadError, UnsupportedError
from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.tokenizers import Tokenizer, hf

transformers = pytest.importorskip("transformers")
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def save_gguf_tokenizer(gguf_path: Path, out: Path) -> Path:
    tok = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def base_dirs(tmp_path_factory):
    """name -> (saved directory, GGUF it came from)."""
    dirs = {}
    for name, arch, dummy in (("llama", "llama", True), ("gemma3", "gemma3", False)):
        gguf_path = tmp_path_factory.mktemp(name) / f"{name}.gguf"
        write_spm_gguf(gguf_path, train_sentencepiece(dummy, arch == "gemma3"), arch, dummy)
        dirs[name] = (save_gguf_tokenizer(gguf_path, gguf_path.parent / "hf"), gguf_path)
    return dirs


@pytest.fixture(scope="module")
def smollm_dir(tmp_path_factory, hf_test_tokenizer):
    out = tmp_path_factory.mktemp("smollm")
    hf_test_tokenizer.save_pretrained(out)
    return out


def variant(base: Path, tmp_path: Path, config: dict | None = None, drop_keys=(), files=None,
            tokenizer_json=None) -> Path:
    """A copy of `base` with tokenizer_config.json keys set/removed, files written, and
    tokenizer.json edited by tokenizer_json(dict)."""
    d = tmp_path / "variant"
    shutil.copytree(base, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.update(config or {})
    for key in drop_keys:
        cfg.pop(key, None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    for name, content in (files or {}).items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(content)
    if tokenizer_json is not None:
        data = json.loads((d / "tokenizer.json").read_text())
        tokenizer_json(data)
        (d / "tokenizer.json").write_text(json.dumps(data))
    return d


def assert_same_as_autotokenizer(d: Path) -> Tokenizer:
    tok, ref = Tokenizer.from_hf_dir(d), transformers.AutoTokenizer.from_pretrained(d)
    for text in CORPUS:
        for add in (True, False):
            assert tok.encode(text, add) == ref(text, add_special_tokens=add)["input_ids"], text
        ids = ref(text)["input_ids"]
        for skip in (True, False):
            assert tok.decode(ids, skip) == ref.decode(ids, skip_special_tokens=skip), text
    assert (tok.bos_token, tok.eos_token) == (ref.bos_token, ref.eos_token)
    assert (tok.bos_token_id, tok.eos_token_id) == (ref.bos_token_id, ref.eos_token_id)
    assert (tok.unk_token_id, tok.pad_token_id) == (ref.unk_token_id, ref.pad_token_id)
    assert set(ref.all_special_ids) <= set(tok.all_special_ids)
    assert tok.vocab_size == len(ref)
    templates = ref.chat_template
    assert tok.chat_templates == ({"default": templates} if isinstance(templates, str)
                                  else templates or {})
    return tok


# --- parity with AutoTokenizer ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_saved_gguf_tokenizer_matches_autotokenizer(base_dirs, name):
    assert_same_as_autotokenizer(base_dirs[name][0])


@pytest.mark.slow
def test_saved_smollm_tokenizer_matches_autotokenizer(smollm_dir):
    tok = assert_same_as_autotokenizer(smollm_dir)
    assert tok.eos_token == "<|im_end|>" and tok.vocab_size == 49152


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_same_ids_as_the_gguf_it_came_from(base_dirs, name):
    d, gguf_path = base_dirs[name]
    tok = Tokenizer.from_hf_dir(d)
    ref = Tokenizer.from_gguf_metadata(GGUFReader(gguf_path).metadata)
    assert all(tok.encode(t) == ref.encode(t) for t in CORPUS)
    assert tok.all_special_ids == ref.all_special_ids
    every = range(ref.vocab_size)
    assert [tok.id_to_bytes(i) for i in every] == [ref.id_to_bytes(i) for i in every]


@pytest.mark.parametrize("add_bos, keep_post_processor", [(True, False), (False, True)])
def test_add_bos_token_follows_tokenizer_json(base_dirs, tmp_path, add_bos, keep_post_processor):
    """transformers 5 pops add_bos/eos_token when tokenizer.json exists: its post-processor
    (or none) decides."""

    def edit(data):
        if not keep_post_processor:
            data["post_processor"] = None

    d = variant(base_dirs["llama"][0], tmp_path, {"add_bos_token": add_bos,
                "add_eos_token": add_bos}, tokenizer_json=edit)
    tok = assert_same_as_autotokenizer(d)
    assert (tok.encode("x")[0] == tok.bos_token_id) == keep_post_processor


def test_special_tokens_named_only_in_the_config(base_dirs, tmp_path):
    """Tokens the config names become special (matched whole, skipped on decode) as
    transformers 5 makes them, listed ones only where tokenizer.json did not add them."""

    def drop_added(data):
        data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|im_end|>"]

    config = {"eos_token": "<|im_end|>", "image_token": "</think>",
              "additional_special_tokens": ["<think>"]}
    d = variant(base_dirs["llama"][0], tmp_path, config, tokenizer_json=drop_added)
    tok = assert_same_as_autotokenizer(d)
    vocab = tok.backend.get_vocab()
    assert tok.eos_token_id == vocab["<|im_end|>"]
    # named tokens become special; a listed one tokenizer.json already added keeps its flags
    assert tok.decode(tok.encode("a<|im_end|><think>b</think>")) == "a<think>b"
    assert vocab["<think>"] in tok.all_special_ids


# --- chat templates ---------------------------------------------------------------------------

TEMPLATE_CASES = {
    "config string": ({"chat_template": TEMPLATE}, {}),
    "config list": ({"chat_template": [{"name": "default", "template": TEMPLATE},
                                       {"name": "tool_use", "template": "T"}]}, {}),
    "jinja file over config": ({"chat_template": "old"}, {"chat_template.jinja": TEMPLATE}),
    "jinja files": ({}, {"chat_template.jinja": TEMPLATE,
                         "additional_chat_templates/tool_use.jinja": "T"}),
    "extra file only replaces config": ({"chat_template": "old"},
                                        {"additional_chat_templates/rag.jinja": "R"}),
    "none": ({}, {}),
}


@pytest.mark.parametrize("name", TEMPLATE_CASES)
def test_chat_templates_as_transformers_reads_them(base_dirs, tmp_path, name):
    config, files = TEMPLATE_CASES[name]
    tok = assert_same_as_autotokenizer(variant(base_dirs["llama"][0], tmp_path, config,
                                               ["chat_template"], files))
    assert tok.chat_template == tok.chat_templates.get("default")


def test_processor_chat_template_json_is_the_last_resort(base_dirs, tmp_path):
    files = {"chat_template.json": json.dumps({"chat_template": TEMPLATE})}
    d = variant(base_dirs["llama"][0], tmp_path, drop_keys=["chat_template"], files=files)
    assert Tokenizer.from_hf_dir(d).chat_template == TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "cfg"}))
    assert Tokenizer.from_hf_dir(d).chat_template == "cfg"


# --- custom code is never run -----------------------------------------------------------------


def test_custom_tokenizer_code_is_refused_and_not_run(base_dirs, tmp_path):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('x')\nclass EvilTokenizer: pass\n"
    config = {"tokenizer_class": "EvilTokenizer",
              "auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}}
    d = variant(base_dirs["llama"][0], tmp_path, config, files={"tokenization_evil.py": code})
    with pytest.raises(UnsupportedError, match="custom code.*EvilTokenizer"):
        Tokenizer.from_hf_dir(d)
    (d / "tokenizer_config.json").write_text(json.dumps({"auto_map": ["x.EvilTokenizer", None]}))
    with pytest.raises(UnsupportedError, match="custom code"):
        Tokenizer.from_hf_dir(d)
    assert not marker.exists()


def test_auto_map_beside_a_stock_class_loads(base_dirs, tmp_path):
    config = {"auto_map": {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}}
    d = variant(base_dirs["llama"][0], tmp_path, config)
    assert Tokenizer.from_hf_dir(d).encode("a") == Tokenizer.from_hf_dir(base_dirs["llama"][0]
                                                                          ).encode("a")


# --- hostile directories ----------------------------------------------------------------------


def test_missing_files(tmp_path):
    with pytest.raises(ModelLoadError, match="not a directory"):
        Tokenizer.from_hf_dir(tmp_path / "absent")
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"\x00")
    with pytest.raises(UnsupportedError, match="tokenizer.model"):
        Tokenizer.from_hf_dir(tmp_path)


BAD_FILES = {
    "tokenizer.json not JSON": {"tokenizer.json": "{"},
    "tokenizer.json not a tokenizer": {"tokenizer.json": '{"model": 3}'},
    "tokenizer.json a list": {"tokenizer.json": "[1]"},
    "tokenizer.json not UTF-8": {"tokenizer.json": b"\xff\xfe"},
    "config not JSON": {"tokenizer_config.json": "{'a': 1}"},
    "config a list": {"tokenizer_config.json": "[]"},
    "config nested 100000 deep": {"tokenizer_config.json": "[" * 100000 + "]" * 100000},
    "bos_token a number": {"tokenizer_config.json": '{"bos_token": 5}'},
    "chat_template a number": {"tokenizer_config.json": '{"chat_template": 5}'},
    "chat_template list of strings": {"tokenizer_config.json": '{"chat_template": ["x"]}'},
    "extra tokens not a list": {"tokenizer_config.json": '{"additional_special_tokens": 3}'},
    "template not UTF-8": {"chat_template.jinja": b"\xc3"},
    "chat_template.json a list": {"chat_template.json": "[]"},
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_malformed_files(base_dirs, tmp_path, name):
    d = variant(base_dirs["llama"][0], tmp_path, drop_keys=["chat_template"])
    for file, content in BAD_FILES[name].items():
        (d / file).write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ModelLoadError, match=r"\.json|\.jinja"):
        Tokenizer.from_hf_dir(d)


@pytest.mark.parametrize("file", ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"])
def test_fifo_and_directory_are_refused_without_blocking(base_dirs, tmp_path, file):
    d = variant(base_dirs["llama"][0], tmp_path)
    (d / file).unlink(missing_ok=True)
    os.mkfifo(d / file)
    with pytest.raises(ModelLoadError, match="not a regular file"):
        Tokenizer.from_hf_dir(d)
    (d / file).unlink()
    (d / file).mkdir()
    with pytest.raises(ModelLoadError, match="not a regular file"):
        Tokenizer.from_hf_dir(d)


def test_size_caps(base_dirs, tmp_path, monkeypatch):
    d = variant(base_dirs["llama"][0], tmp_path, files={"chat_template.jinja": "x" * 101})
    monkeypatch.setattr(hf, "MAX_TEMPLATE_BYTES", 100)
    with pytest.raises(ModelLoadError, match="over the 100"):
        Tokenizer.from_hf_dir(d)
    monkeypatch.setattr(hf, "MAX_TOKENIZER_JSON_BYTES", 1000)
    with pytest.raises(ModelLoadError, match="tokenizer.json.*over the 1000"):
        Tokenizer.from_hf_dir(d)
