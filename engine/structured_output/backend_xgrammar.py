"""The xgrammar backend: TokenizerInfo from our GGUF tokenizer, compilers, request matchers,
and the xgrammar half of request validation.

Mirrors vllm/v1/structured_output/backend_xgrammar.py (vLLM 0.33, xgrammar 0.2.8): two
compilers (special tokens blanked for JSON/regex/choice/EBNF; the full vocab for Lark and
structural tags), `has_xgrammar_unsupported_json_features` (what `auto` hands to guidance)
and `validate_xgrammar_grammar` with upstream's messages. Compiled grammars are reused from
xgrammar's own cache, bounded in bytes by VLLM_XGRAMMAR_CACHE_MB as in vLLM (no second cache
here: one holding the compiled grammars would keep alive what xgrammar's bound evicted);
each request gets its own GrammarMatcher.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
import xgrammar as xgr

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.structured_output.backend_types import (
    StructuredOutputBackend,
    StructuredOutputGrammar,
    StructuredOutputOptions,
)
from libvllm.engine.structured_output.json_nesting import check_json_nesting
from libvllm.engine.structured_output.params import StructuredOutputsParams
from libvllm.engine.structured_output.utils import (
    choice_as_grammar,
    compile_regex_with_timeout,
    grammar_is_likely_lark,
)

_O = StructuredOutputOptions


def tokenizer_infos(tokenizer, vocab_size: int) -> tuple[xgr.TokenizerInfo, xgr.TokenizerInfo]:
    """(special tokens blanked, full vocab) TokenizerInfos of our Tokenizer's `tokenizers`
    backend; xgrammar detects the vocab type (byte-level BPE, SentencePiece byte fallback)
    from the backend JSON, as TokenizerInfo.from_huggingface does for vLLM."""
    from transformers import PreTrainedTokenizerFast  # xgrammar imports transformers anyway

    stop = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None
    full = xgr.TokenizerInfo.from_huggingface(
        PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend),
        vocab_size=vocab_size,
        stop_token_ids=stop,
    )
    special = set(tokenizer.all_special_ids)
    encoded = [""] * vocab_size
    for piece, token_id in tokenizer.backend.get_vocab(with_added_tokens=True).items():
        if token_id < vocab_size and token_id not in special:
            encoded[token_id] = piece
    return xgr.TokenizerInfo.from_vocab_and_metadata(encoded, full.dump_metadata()), full


@dataclass
class XgrammarBackend(StructuredOutputBackend):
    def __post_init__(self) -> None:
        cache_bytes = self.config.xgrammar_cache_mb * 1024 * 1024
        self.compiler, self.full_vocab_compiler = (
            xgr.GrammarCompiler(
                info, max_threads=8, cache_enabled=True, cache_limit_bytes=cache_bytes
            )
            for info in tokenizer_infos(self.tokenizer, self.vocab_size)
        )

    def _compile(self, request_type: StructuredOutputOptions, spec: str) -> xgr.CompiledGrammar:
        any_ws = not self.config.disable_any_whitespace
        separators = (",", ":") if self.config.disable_any_whitespace else None
        if request_type in (_O.JSON, _O.JSON_OBJECT):
            schema = spec if request_type == _O.JSON else '{"type": "object"}'
            return self.compiler.compile_json_schema(
                schema, any_whitespace=any_ws, separators=separators
            )
        if request_type == _O.GRAMMAR:
            if grammar_is_likely_lark(spec):
                return self.full_vocab_compiler.compile_lark(spec)
            return self.compiler.compile_grammar(spec)
        if request_type == _O.REGEX:
            timeout = self.config.regex_compilation_timeout_s
            return compile_regex_with_timeout(self.compiler.compile_regex, spec, timeout)
        if request_type == _O.CHOICE:
            return self.compiler.compile_grammar(choice_as_grammar(json.loads(spec)))
        if request_type == _O.STRUCTURAL_TAG:
            return self.full_vocab_compiler.compile_structural_tag(*_structural_tag_args(spec))
        raise InvalidArgumentError(f"grammar is not of valid supported types. ({request_type!s})")

    def compile_grammar(
        self,
        request_type: StructuredOutputOptions,
        grammar_spec: str,
        stop_token_ids: set[int] | None = None,
    ) -> StructuredOutputGrammar:
        ctx = self._compile(request_type, grammar_spec)  # xgrammar's cache: a hit is cheap
        matcher = xgr.GrammarMatcher(
            ctx, override_stop_tokens=sorted(stop_token_ids) if stop_token_ids else None
        )
        return XgrammarGrammar(matcher)

    def destroy(self) -> None:
        del self.compiler, self.full_vocab_compiler


def _structural_tag_args(spec: str) -> tuple:
    """compile_structural_tag arguments: legacy {"structures", "triggers"} or the new form."""
    s_tag = json.loads(spec)
    if "structures" not in s_tag:
        return (spec,)
    tags = [
        xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
        for s in s_tag["structures"]
    ]
    return tags, s_tag["triggers"]


class XgrammarGrammar(StructuredOutputGrammar):
    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self.matcher = matcher
        self._is_terminated = False

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        if self._is_terminated:
            return True
        for token in tokens:
            if not self.matcher.accept_token(token):
                return False
            self._is_terminated = self.matcher.is_terminated()
            if self._is_terminated:
                break
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        if self._is_terminated:
            return []
        accepted: list[int] = []
        for token in tokens:
            if not self.matcher.accept_token(token):
                break
            accepted.append(token)
            if self.matcher.is_terminated():
                break
        if accepted:
            self.matcher.rollback(len(accepted))
        return accepted

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)
        self._is_terminated = self.matcher.is_terminated()

    def fill_bitmask(self, bitmask: torch.Tensor, idx: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, idx)

    def is_terminated(self) -> bool:
        return self._is_terminated


# String formats xgrammar's JSON-schema converter implements (json_schema_converter.cc).
STRING_SUPPORTED_FORMATS = frozenset(
    "email date time date-time duration ipv4 ipv6 hostname uuid uri uri-reference "
    "uri-template json-pointer relative-json-pointer".split()
)


def _schema_types(schema: dict) -> set[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    return {x for x in t if isinstance(x, str)} if isinstance(t, list) else set()


def _pattern_and_length(schema: dict) -> bool:
    return ("pattern" in schema or "format" in schema) and (
        "minLength" in schema or "maxLength" in schema
    )


def _node_unsupported(obj: dict) -> bool:
    types = _schema_types(obj)
    if types & {"integer", "number"} and "multipleOf" in obj:
        return True
    if "array" in types and any(
        k in obj for k in ("uniqueItems", "contains", "minContains", "maxContains")
    ):
        return True
    if "string" in types and (
        ("format" in obj and obj["format"] not in STRING_SUPPORTED_FORMATS)
        or _pattern_and_length(obj)
    ):
        return True
    if "object" in types and "propertyNames" in obj:
        names = obj.get("propertyNames")
        if (isinstance(names, dict) and _pattern_and_length(names)) or any(
            k in obj for k in ("patternProperties", "properties")
        ):
            return True
        if obj.get("unevaluatedProperties", True) is not True:
            return True
    pattern_props = obj.get("patternProperties")
    if "object" in types and isinstance(pattern_props, dict):
        if "properties" in obj or len(pattern_props) > 1:
            return True
    all_of = obj.get("allOf")
    return isinstance(all_of, list) and len(all_of) >= 2


def has_xgrammar_unsupported_json_features(schema: dict) -> bool:
    """Whether the schema uses a keyword combination xgrammar would silently ignore."""
    stack = [schema]
    while stack:
        obj = stack.pop()
        if not isinstance(obj, dict):
            continue
        if _node_unsupported(obj):
            return True
        for value in obj.values():
            if isinstance(value, dict):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, dict))
    return False


def validate_xgrammar_grammar(params: StructuredOutputsParams, regex_timeout: float = 5) -> None:
    """Raise InvalidArgumentError unless xgrammar can honour `params` (a choice is rewritten
    into an EBNF grammar, as upstream does)."""
    if params.regex is not None:
        if "\x00" in params.regex:
            raise InvalidArgumentError(
                "structured_outputs.regex must not contain a NUL character ('\\x00')"
            )
        try:
            compile_regex_with_timeout(xgr.Grammar.from_regex, params.regex, regex_timeout)
        except Exception as err:
            raise InvalidArgumentError(f"Failed to transform regex into a grammar: {err}") from err
        return
    if params.choice:
        grammar = choice_as_grammar(params.choice)
        try:
            xgr.Grammar.from_ebnf(grammar)
        except Exception as err:
            msg = f"Failed to transform choices into a grammar: {err}"
            raise InvalidArgumentError(msg) from err
        params.choice, params.grammar = None, grammar
        return
    if params.json is not None:
        check_json_nesting(params.json)
        schema = params.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as err:
                raise InvalidArgumentError("Invalid JSON grammar specification.") from err
        if has_xgrammar_unsupported_json_features(schema):
            raise InvalidArgumentError(
                "The provided JSON schema contains features not supported by xgrammar."
            )
        try:
            xgr.Grammar.from_json_schema(params.json)
        except Exception as err:
            msg = f"Failed to transform json schema into a grammar: {err}"
            raise InvalidArgumentError(msg) from err
        return
    if params.json_object:
        return
    if params.grammar:
        try:
            if grammar_is_likely_lark(params.grammar):
                xgr.Grammar.from_lark(params.grammar)
            else:
                xgr.Grammar.from_ebnf(params.grammar)
        except Exception as err:
            raise InvalidArgumentError("Invalid grammar specification.") from err
        return
    if params.structural_tag:
        check_json_nesting(params.structural_tag, structural_tag=True)
        try:
            xgr.Grammar.from_structural_tag(*_structural_tag_args(params.structural_tag))
        except Exception as err:
            raise InvalidArgumentError("Invalid structural tag specification.") from err
        return
    raise InvalidArgumentError(
        "XGrammar structured outputs backend does not support this structured outputs specification"
    )
