"""check_json_nesting: the depth limit on a structured-output JSON schema or structural tag.

Mirrors `check_json_nesting` of vllm/sampling_params.py (vLLM 0.33).
"""

from __future__ import annotations

import json
from typing import Any

from libvllm.engine.errors import InvalidArgumentError

MAX_STRUCTURED_OUTPUT_JSON_NESTING = 64
STRUCTURAL_TAG_WRAPPER_NESTING = 16


def _exceeds_json_nesting(spec: str | dict[str, Any], limit: int) -> bool:
    """Whether a JSON document nests objects and arrays deeper than `limit`."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except RecursionError:
            return True
        except ValueError:
            return False  # malformed JSON is reported by the backend validation
    level: list[Any] = [spec]
    for _ in range(limit):
        level = [
            child
            for node in level
            if isinstance(node, (dict, list))
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (dict, list))
        ]
        if not level:
            return False
    return True


def check_json_nesting(spec: str | dict | None, *, structural_tag: bool = False) -> None:
    """Reject a schema nested deeper than 64 levels (80 for a structural tag)."""
    limit = MAX_STRUCTURED_OUTPUT_JSON_NESTING
    if structural_tag:
        limit += STRUCTURAL_TAG_WRAPPER_NESTING
    if spec and _exceeds_json_nesting(spec, limit):
        raise InvalidArgumentError(
            "The JSON schema is nested too deeply: objects and arrays may nest at "
            f"most {MAX_STRUCTURED_OUTPUT_JSON_NESTING} levels"
        )
