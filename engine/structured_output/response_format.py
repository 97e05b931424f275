"""OpenAI `response_format` / vLLM `structured_outputs` request fields -> StructuredOutputsParams.

Mirrors `structured_outputs_from_response_format` of vllm/entrypoints/generate/base/protocol.py
and the response_format checks of ChatCompletionRequest (vLLM 0.33): text -> unchanged,
json_object -> json_object=True, json_schema -> json=<schema>, structural_tag -> the whole
object as JSON text, set on top of the request's structured_outputs (two constraints
are then the usual "only one kind" error, as upstream).
Works on the plain dicts the OpenAI layer parses.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.structured_output.params import StructuredOutputsParams

_FIELDS = {f.name for f in dataclasses.fields(StructuredOutputsParams) if f.init}


def params_from_dict(data: dict[str, Any]) -> StructuredOutputsParams:
    """`structured_outputs` request field (a JSON object) -> params; unknown keys are errors."""
    if not isinstance(data, dict):
        raise InvalidArgumentError("structured_outputs must be an object")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise InvalidArgumentError(f"structured_outputs has unknown fields: {unknown}")
    return StructuredOutputsParams(**data)


def _overrides(response_format: dict[str, Any]) -> dict[str, Any] | None:
    if not isinstance(response_format, dict):
        raise InvalidArgumentError("response_format must be an object")
    rf_type = response_format.get("type")
    if rf_type == "text":
        return None
    if rf_type == "json_object":
        return {"json_object": True}
    if rf_type == "json_schema":
        spec = response_format.get("json_schema")
        if spec is None:
            raise InvalidArgumentError(
                "When response_format type is 'json_schema', the "
                "'json_schema' field must be provided."
            )
        if not isinstance(spec, dict) or not isinstance(spec.get("name", ""), str):
            raise InvalidArgumentError("response_format.json_schema must be an object")
        return {"json": spec.get("schema")}
    if rf_type == "structural_tag":
        if not ("format" in response_format or "structures" in response_format):
            raise InvalidArgumentError("Invalid response_format structural_tag specification.")
        return {"structural_tag": json.dumps(response_format)}
    raise InvalidArgumentError(
        "response_format type must be one of 'text', 'json_object', 'json_schema' or "
        f"'structural_tag', got {rf_type!r}"
    )


def structured_outputs_from_response_format(
    structured_outputs: StructuredOutputsParams | dict | None,
    response_format: dict[str, Any] | None,
) -> StructuredOutputsParams | None:
    if isinstance(structured_outputs, dict):
        structured_outputs = params_from_dict(structured_outputs)
    overrides = None if response_format is None else _overrides(response_format)
    if overrides is None:
        return structured_outputs
    if structured_outputs is None:
        return StructuredOutputsParams(**overrides)
    return dataclasses.replace(structured_outputs, **overrides)
