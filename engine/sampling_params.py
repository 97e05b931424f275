"""SamplingParams: per-request generation controls, mirroring vllm/sampling_params.py.

Field names, defaults and validation messages follow vLLM 0.33. Fields not yet
implemented by the sampler are not declared (issue 4 adds penalties, logprobs, ...),
so a caller can never set a knob that is silently ignored.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from engine.errors import InvalidArgumentError

_SAMPLING_EPS = 1e-5
_MAX_TEMP = 1e-2
MAX_N_SEQUENCES = 16384  # VLLM_MAX_N_SEQUENCES


class RequestOutputKind(enum.IntEnum):
    CUMULATIVE = 0  # every output carries all text/tokens so far
    DELTA = 1  # only what is new since the previous output
    FINAL_ONLY = 2  # nothing until the request finishes


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Filled by the engine: eos + stop_token_ids (vLLM's _all_stop_token_ids).
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if 0 < self.temperature < _MAX_TEMP:
            self.temperature = _MAX_TEMP
        if self.seed == -1:
            self.seed = None
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids or []))
        self._verify_args()
        if self.temperature < _SAMPLING_EPS:  # greedy
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise InvalidArgumentError(f"n must be 1 when using greedy sampling, got {self.n}.")
        self.all_stop_token_ids.update(self.stop_token_ids)

    @property
    def sampling_type_greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS

    def _verify_args(self) -> None:
        err = InvalidArgumentError
        if not isinstance(self.n, int) or isinstance(self.n, bool):
            raise err(f"n must be an int, but is of type {type(self.n)}")
        if self.n < 1:
            raise err(f"n must be at least 1, got {self.n}.")
        if self.n > MAX_N_SEQUENCES:
            raise err(f"n must be at most {MAX_N_SEQUENCES}, got {self.n}.")
        if not math.isfinite(self.temperature):
            raise err(f"temperature must be a finite number, got {self.temperature}.")
        if self.temperature < 0.0:
            raise err(f"temperature must be non-negative, got {self.temperature}.")
        if self.temperature > 2.0:
            raise err(f"temperature must be in [0, 2], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise err(f"top_p must be in (0, 1], got {self.top_p}.")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise err(f"top_k must be an integer, got {type(self.top_k).__name__}")
        if self.top_k < -1:
            raise err(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise err(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise err(f"seed must fit in 64 bits, got {self.seed}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise err(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.min_tokens < 0:
            raise err(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise err(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                f"got {self.min_tokens}."
            )
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            raise err(f"stop_token_ids must contain only integers, got {self.stop_token_ids}.")
        if any(not s for s in self.stop):
            raise err("stop cannot contain an empty string.")
