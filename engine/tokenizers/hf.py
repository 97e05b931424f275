"""A Hugging Face tokenizer directory -> `tokenizers` backend, special tokens, chat templates.

Mirrors what vllm/tokenizers/hf.py gets from transformers' AutoTokenizer (transformers 5:
tokenization_utils_base.py from_pretrained/_from_pretrained, tokenization_utils_tokenizers.py
TokenizersBackend): tokenizer.json is the pipeline; tokenizer_config.json names the special
tokens (each one in the vocab becomes a special added token, matched whole); its
add_bos_token/add_eos_token are ignored because tokenizer.json's post-processor decides, as in
transformers 5. Chat templates: chat_template.jinja and additional_chat_templates/*.jinja,
which replace tokenizer_config.json's chat_template (a string or a list of {name, template});
chat_template.json (the processor file vLLM reads for multimodal models) is the last resort.

Nothing in the directory is executed or imported: a tokenizer_config.json whose tokenizer
class is custom code (auto_map) is refused, as vLLM refuses it without trust_remote_code.
transformers 5 also rebuilds the normalizer/pre-tokenizer/decoder of some tokenizer classes
from the class instead of tokenizer.json; here tokenizer.json is taken as written. Every file
is read with a size cap; a malformed one raises ModelLoadError naming it.
"""

from __future__ import annotations

import json
import logging
import os
import stat

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from libvllm.engine.errors import ModelLoadError, UnsupportedError

logger = logging.getLogger(__name__)

MAX_TOKENIZER_JSON_BYTES = 256 << 20
MAX_CONFIG_BYTES = 64 << 20
MAX_TEMPLATE_BYTES = 4 << 20
TEMPLATES_DIR = "additional_chat_templates"
_NAMED = ("bos", "eos", "unk", "pad")
_STANDARD = (*_NAMED, "sep", "cls", "mask")  # transformers SPECIAL_TOKENS_ATTRIBUTES
_EXTRA_LISTS = ("additional_special_tokens", "extra_special_tokens")
_ADDED_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized")


def _regular(fd: int) -> bool:
    """Whether fd is a regular file; closes it if not."""
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return True
    os.close(fd)
    return False


def _read(path: str, max_bytes: int) -> bytes:
    """A regular file's bytes, at most max_bytes; OS errors become ModelLoadError. Opened
    non-blocking so that a FIFO is refused instead of waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        if not _regular(fd):
            raise ModelLoadError(f"{path}: not a regular file")
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(fd).st_size
            if size > max_bytes:
                raise ModelLoadError(f"{path}: {size} bytes, over the {max_bytes} limit")
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise ModelLoadError(f"{path}: over the {max_bytes}-byte limit")
    return data


def _text(path: str, max_bytes: int) -> str:
    try:
        return _read(path, max_bytes).decode("utf-8")
    except UnicodeDecodeError:
        raise ModelLoadError(f"{path}: not valid UTF-8") from None


def _json_object(path: str, max_bytes: int) -> dict:
    try:
        value = json.loads(_text(path, max_bytes))
    except (ValueError, RecursionError) as e:
        raise ModelLoadError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _token_text(value: object, where: str) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise ModelLoadError(f"{where} is neither a string nor an AddedToken object")


def _is_token(value: object) -> bool:
    return isinstance(value, str) or isinstance(value, dict) and isinstance(
        value.get("content"), str
    )


def _config_special_tokens(config: dict, where: str) -> list[tuple[bool, str, object]]:
    """(named, key, value) of every special token the config names. Named: the standard
    *_token keys, other *_token keys holding a token and an extra_special_tokens dict
    (transformers 5's model-specific tokens); not named: the additional/extra lists."""
    found = [(True, f"{n}_token", config.get(f"{n}_token")) for n in _STANDARD]
    found += [
        (True, k, v) for k, v in config.items()
        if k.endswith("_token") and k[: -len("_token")] not in _STANDARD and _is_token(v)
    ]
    for key in _EXTRA_LISTS:
        values = config.get(key) or []
        if isinstance(values, dict):
            found += [(True, f"{key}.{k}", v) for k, v in values.items()]
        elif isinstance(values, list):
            found += [(False, key, v) for v in values]
        else:
            raise ModelLoadError(f"{where} {key} must be a list or an object")
    return found


def _add_special_tokens(backend: HFTokenizer, config: dict, where: str) -> list[int]:
    """Make the config's special tokens special added tokens, as transformers 5 does: named
    ones always (their flags from the config), listed ones unless tokenizer.json added them
    already. Tokens not in the vocab are skipped (transformers gives them fresh ids). Returns
    all their ids (part of transformers' all_special_ids)."""
    added = {t.content for t in backend.get_added_tokens_decoder().values()}
    new, ids = [], []
    for named, key, value in _config_special_tokens(config, where):
        text = _token_text(value, f"{where} {key}")
        if text is None:
            continue
        token_id = backend.token_to_id(text)
        if token_id is None:
            logger.warning("%s %s %r is not in the vocab: ignored", where, key, text)
            continue
        ids.append(token_id)
        if named or text not in added:
            flags = {f: value[f] for f in _ADDED_TOKEN_FLAGS
                     if isinstance(value, dict) and isinstance(value.get(f), bool)}
            new.append(AddedToken(text, **{"normalized": False, **flags, "special": True}))
    backend.add_special_tokens(new)
    return ids


def _refuse_custom_code(config: dict, where: str) -> None:
    auto_map = config.get("auto_map")
    if isinstance(auto_map, dict):
        auto_map = auto_map.get("AutoTokenizer")
    if not auto_map:
        return
    refs = auto_map if isinstance(auto_map, list) else [auto_map]
    classes = {r.rsplit(".", 1)[-1] for r in refs if isinstance(r, str)}
    name = config.get("tokenizer_class")
    if name is None or name in classes or f"{name}Fast" in classes:
        raise UnsupportedError(
            f"{where} maps AutoTokenizer to custom code {sorted(classes)}; libvllm never "
            "runs code from a model directory"
        )


def _chat_templates(path: str, config: dict) -> dict[str, str]:
    templates: dict[str, str] = {}
    default = os.path.join(path, "chat_template.jinja")
    if os.path.exists(default):
        templates["default"] = _text(default, MAX_TEMPLATE_BYTES)
    extra = os.path.join(path, TEMPLATES_DIR)
    if os.path.isdir(extra):
        for name in sorted(os.listdir(extra)):
            if name.endswith(".jinja"):
                templates[name[: -len(".jinja")]] = _text(
                    os.path.join(extra, name), MAX_TEMPLATE_BYTES
                )
    if templates:  # template files replace the config's entry
        return templates
    value = config.get("chat_template")
    where = f"{path}/tokenizer_config.json chat_template"
    if value is None:
        legacy = os.path.join(path, "chat_template.json")
        if not os.path.exists(legacy):
            return {}
        value = _json_object(legacy, MAX_TEMPLATE_BYTES).get("chat_template")
        where = f"{legacy} chat_template"
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str)
        and isinstance(t.get("template"), str) for t in value
    ):
        return {t["name"]: t["template"] for t in value}
    raise ModelLoadError(f"{where} must be a string or a list of {{name, template}}")


def load_hf_dir(
    path: str,
) -> tuple[HFTokenizer, dict[str, tuple[str, int] | None], list[int], dict[str, str]]:
    """(backend, bos/eos/unk/pad -> (text, id) or None, the ids of every special token the
    config names, chat templates by name)."""
    if not os.path.isdir(path):
        raise ModelLoadError(f"{path}: not a directory")
    tokenizer_json = os.path.join(path, "tokenizer.json")
    if not os.path.exists(tokenizer_json):
        if os.path.exists(os.path.join(path, "tokenizer.model")):
            raise UnsupportedError(
                f"{path}: only a sentencepiece tokenizer.model, no tokenizer.json; libvllm "
                "loads tokenizer.json"
            )
        raise ModelLoadError(f"{path}: no tokenizer.json")
    config_path = os.path.join(path, "tokenizer_config.json")
    config = _json_object(config_path, MAX_CONFIG_BYTES) if os.path.exists(config_path) else {}
    _refuse_custom_code(config, config_path)
    text = _text(tokenizer_json, MAX_TOKENIZER_JSON_BYTES)
    try:
        backend = HFTokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises a bare Exception for a bad file
        raise ModelLoadError(f"{tokenizer_json}: not a valid tokenizer: {exc}") from None
    special_ids = _add_special_tokens(backend, config, config_path)
    named: dict[str, tuple[str, int] | None] = {}
    for name in _NAMED:
        text = _token_text(config.get(f"{name}_token"), f"{config_path} {name}_token")
        token_id = None if text is None else backend.token_to_id(text)
        named[name] = None if token_id is None else (text, token_id)
    return backend, named, special_ids, _chat_templates(path, config)
