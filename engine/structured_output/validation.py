"""Request validation and `auto` backend choice for structured outputs.

Mirrors `SamplingParams._validate_structured_outputs` of vllm/sampling_params.py (vLLM 0.33):
degenerate specs rejected before any backend looks at them, then xgrammar, guidance, or
`auto` (xgrammar first, guidance when xgrammar rejects the constraint). Upstream's last
resort for schemas neither supports (outlines) is not shipped: such a request fails loudly.
"""

from __future__ import annotations

import json

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.structured_output.config import StructuredOutputsConfig
from libvllm.engine.structured_output.json_nesting import check_json_nesting
from libvllm.engine.structured_output.params import StructuredOutputsParams


def _check_degenerate(p: StructuredOutputsParams) -> None:
    if isinstance(p.choice, list) and not p.choice:
        raise InvalidArgumentError(f"Choice '{p.choice}' cannot be an empty list")
    if isinstance(p.grammar, str) and p.grammar.strip() == "":
        raise InvalidArgumentError("structured_outputs.grammar cannot be an empty string")
    if isinstance(p.json, str) and p.json.strip() == "":
        raise InvalidArgumentError("structured_outputs.json cannot be an empty string")
    check_json_nesting(p.json)
    check_json_nesting(p.structural_tag, structural_tag=True)
    if p.json_object is False:
        raise InvalidArgumentError(
            "structured_outputs.json_object must be True if set; omit "
            "structured_outputs to disable structured outputs"
        )
    if p.regex and "\x00" in p.regex:
        raise InvalidArgumentError(
            "structured_outputs.regex must not contain a NUL character ('\\x00')"
        )
    if isinstance(p.structural_tag, str) and p.structural_tag.strip() == "":
        raise InvalidArgumentError("structured_outputs.structural_tag cannot be an empty string")


def _auto(p: StructuredOutputsParams, config: StructuredOutputsConfig) -> str:
    from libvllm.engine.structured_output.backend_guidance import (
        has_guidance_unsupported_json_features,
        validate_guidance_grammar,
    )
    from libvllm.engine.structured_output.backend_xgrammar import validate_xgrammar_grammar

    try:
        validate_xgrammar_grammar(p, config.regex_compilation_timeout_s)
        return "xgrammar"
    except InvalidArgumentError as xgrammar_error:
        if p.json is not None:
            try:
                schema = json.loads(p.json) if isinstance(p.json, str) else p.json
            except ValueError as e:
                raise InvalidArgumentError("Invalid JSON grammar specification.") from e
            if has_guidance_unsupported_json_features(schema):
                raise InvalidArgumentError(
                    "No compatible structured output backend was found for this request. "
                    f"XGrammar rejected the constraint ({xgrammar_error}), and Guidance does "
                    "not support `patternProperties` in this schema."
                ) from xgrammar_error
        validate_guidance_grammar(p)
        return "guidance"


def validate_structured_outputs(
    p: StructuredOutputsParams, config: StructuredOutputsConfig
) -> StructuredOutputsParams:
    """Validate `p` in place for `config.backend`, set its `_backend`; return it.

    Raises InvalidArgumentError (HTTP 400 / VLLM_ERR_INVALID_ARGUMENT) on a bad constraint.
    """
    if not isinstance(p, StructuredOutputsParams):
        raise InvalidArgumentError("structured_outputs must be a StructuredOutputsParams")
    backend = config.backend
    if p._backend:
        if backend != p._backend and not (backend == "auto" and p._backend_was_auto):
            raise InvalidArgumentError(
                "Request-level structured output backend selection is not "
                f"supported. The request specified '{p._backend}', but vLLM "
                f"was initialised with '{backend}'. This error can be "
                "resolved by removing '_backend' from the request."
            )
    else:
        p._backend = backend
    _check_degenerate(p)
    # the backends are imported when a request uses one (as vLLM's SamplingParams)
    if backend == "xgrammar":
        from libvllm.engine.structured_output.backend_xgrammar import validate_xgrammar_grammar

        validate_xgrammar_grammar(p, config.regex_compilation_timeout_s)
    elif backend == "guidance":
        from libvllm.engine.structured_output.backend_guidance import validate_guidance_grammar

        validate_guidance_grammar(p)
    else:
        p._backend = _auto(p, config)
        p._backend_was_auto = True
    p.__post_init__()
    return p
