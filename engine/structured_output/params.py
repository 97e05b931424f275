"""Structured-output request parameters: the constraint kinds and their shape checks.

Mirrors `StructuredOutputsParams` of vllm/sampling_params.py (vLLM 0.33): exactly one of
json / regex / choice / grammar / json_object / structural_tag, with vLLM's messages. Field
types are checked here (upstream gets that from pydantic) so a hostile request is a clear
InvalidArgumentError, never a crash deeper down.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libvllm.engine.errors import InvalidArgumentError

CONSTRAINT_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # Options accepted per request and, as in vLLM, decided by the engine config instead.
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None
    # Set only by validate_structured_outputs (vLLM's Processor._validate_structured_output).
    _backend: str | None = field(default=None, init=False)
    _backend_was_auto: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        _check_types(self)
        count = sum(getattr(self, name) is not None for name in CONSTRAINT_FIELDS)
        if count > 1:
            raise InvalidArgumentError(
                "You can only use one kind of structured outputs constraint "
                f"but multiple are specified: {self.__dict__}"
            )
        if count < 1:
            raise InvalidArgumentError(
                "You must use one kind of structured outputs constraint "
                f"but none are specified: {self.__dict__}"
            )

    def all_constraints_none(self) -> bool:
        return all(getattr(self, name) is None for name in CONSTRAINT_FIELDS)


def _check_types(p: StructuredOutputsParams) -> None:
    expected = {
        "json": (str, dict),
        "regex": (str,),
        "grammar": (str,),
        "json_object": (bool,),
        "structural_tag": (str,),
        "whitespace_pattern": (str,),
    }
    for name, kinds in expected.items():
        value = getattr(p, name)
        if value is not None and not isinstance(value, kinds):
            names = " or ".join("object" if k is dict else k.__name__ for k in kinds)
            raise InvalidArgumentError(
                f"structured_outputs.{name} must be a {names}, got {type(value).__name__}"
            )
    if p.choice is not None and (
        not isinstance(p.choice, list) or not all(isinstance(c, str) for c in p.choice)
    ):
        raise InvalidArgumentError("structured_outputs.choice must be a list of strings")
    for name in ("disable_any_whitespace", "disable_additional_properties"):
        if not isinstance(getattr(p, name), bool):
            raise InvalidArgumentError(f"structured_outputs.{name} must be a bool")
