"""PoolerConfig and the runner / convert resolution of a pooling engine.

Mirrors vllm/config/pooler.py (PoolerConfig: pooling_type resolved into seq_pooling_type
CLS | LAST | MEAN or tok_pooling_type ALL, use_activation, dimensions, the removed
`normalize`) and vllm/config/model.py (`runner` auto | generate | pooling, `convert`
auto | none | embed | classify, _get_runner_type / _get_convert_type, the default
pooler of a *ForCausalLM converted with `--convert embed`: LAST token, activation =
L2 normalization, vllm/model_executor/models/adapters.py as_embedding_model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from libvllm.engine.errors import InvalidArgumentError, UnsupportedError

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify")
SEQ_POOLING_TYPES = ("CLS", "LAST", "MEAN")
TOK_POOLING_TYPES = ("ALL",)  # STEP (reward models) has no model here
POOLING_TASKS = ("embed", "token_embed")  # the supported tasks of a converted decoder


@dataclass
class PoolerConfig:
    """vLLM's PoolerConfig fields this engine implements."""

    task: str | None = None  # the model's pooling_task (/pooling's default): embed | token_embed
    pooling_type: str | None = None  # convenience: resolved into seq_ / tok_pooling_type
    seq_pooling_type: str | None = None  # CLS | LAST | MEAN
    tok_pooling_type: str | None = None  # ALL
    use_activation: bool | None = None  # embed: L2-normalize; None: the pooler's (True)
    dimensions: int | None = None  # matryoshka truncation default of requests

    def __post_init__(self) -> None:
        if self.pooling_type is not None:
            if self.seq_pooling_type is not None:
                raise InvalidArgumentError(
                    "Cannot set both `pooling_type` and `seq_pooling_type`")
            if self.tok_pooling_type is not None:
                raise InvalidArgumentError(
                    "Cannot set both `pooling_type` and `tok_pooling_type`")
            if self.pooling_type in SEQ_POOLING_TYPES:
                self.seq_pooling_type = self.pooling_type
            elif self.pooling_type in TOK_POOLING_TYPES:
                self.tok_pooling_type = self.pooling_type
            else:
                raise InvalidArgumentError(
                    f"pooling_type must be one of {[*SEQ_POOLING_TYPES, *TOK_POOLING_TYPES]}, "
                    f"got {self.pooling_type!r}")
            self.pooling_type = None  # resolved (a copy of the config builds the same)
        if self.task not in (None, *POOLING_TASKS):
            raise InvalidArgumentError(f"pooler_config task must be one of "
                                       f"{list(POOLING_TASKS)}, got {self.task!r}")
        if self.seq_pooling_type not in (None, *SEQ_POOLING_TYPES):
            raise InvalidArgumentError(f"seq_pooling_type must be one of "
                                       f"{list(SEQ_POOLING_TYPES)}, got "
                                       f"{self.seq_pooling_type!r}")
        if self.tok_pooling_type not in (None, *TOK_POOLING_TYPES):
            raise InvalidArgumentError(f"tok_pooling_type must be one of "
                                       f"{list(TOK_POOLING_TYPES)}, got "
                                       f"{self.tok_pooling_type!r}")
        if self.use_activation is not None and not isinstance(self.use_activation, bool):
            raise InvalidArgumentError("use_activation must be a bool")
        if self.dimensions is not None and (isinstance(self.dimensions, bool) or not
                                            isinstance(self.dimensions, int)):
            raise InvalidArgumentError("dimensions must be an int")

    @classmethod
    def from_json(cls, text: str | dict | None) -> PoolerConfig | None:
        """--pooler-config: a JSON object of vLLM's field names (None / "": none)."""
        if text is None or text == "":
            return None
        try:
            data = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError as e:
            raise InvalidArgumentError(f"pooler_config is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise InvalidArgumentError("pooler_config must be a JSON object")
        if "normalize" in data:
            raise InvalidArgumentError(
                "Parameter `normalize` was removed; use `use_activation` instead.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidArgumentError(f"unknown pooler_config field(s) {unknown}; this "
                                       f"engine supports {sorted(known)}")
        return cls(**data)


def check_runner_convert(runner: str, convert: str) -> None:
    """The option values (vllm/config/model.py RunnerOption, ConvertOption)."""
    if runner not in RUNNERS:
        raise InvalidArgumentError(f"runner must be one of {list(RUNNERS)}, got {runner!r}")
    if convert not in CONVERTS:
        raise InvalidArgumentError(f"convert must be one of {list(CONVERTS)}, got {convert!r}")


def resolve_runner_type(runner: str, convert: str) -> str:
    """vLLM's _get_runner_type and checks for the engine's models, all *ForCausalLM text
    generation models: auto is generate unless a conversion is asked; `--runner pooling`
    needs `--convert embed` (auto resolves to it); classify has no score head here."""
    runner_type = runner if runner != "auto" else (
        "generate" if convert in ("auto", "none") else "pooling")
    convert_type = convert if convert != "auto" else (
        "embed" if runner_type == "pooling" else "none")
    if runner_type == "generate" and convert_type != "none":
        raise InvalidArgumentError("This model does not support `--runner generate`.")
    if runner_type == "pooling" and convert_type == "none":
        raise InvalidArgumentError(
            "This model does not support `--runner pooling`. You can pass "
            "`--convert <embed|classify> to adapt it into a pooling model.")
    if convert_type == "classify":
        raise UnsupportedError("--convert classify needs a classification head (score "
                               "weights), which this engine does not load")
    return runner_type


def resolve_pooler_config(config: PoolerConfig | None) -> PoolerConfig:
    """The pooler of a converted decoder (as_embedding_model): LAST token, ALL for
    token tasks, activation (normalization) on; user fields win."""
    config = config or PoolerConfig()
    seq = config.seq_pooling_type or "LAST"
    tok = config.tok_pooling_type or "ALL"
    return PoolerConfig(task=config.task or "embed", seq_pooling_type=seq, tok_pooling_type=tok,
                        use_activation=config.use_activation, dimensions=config.dimensions)
