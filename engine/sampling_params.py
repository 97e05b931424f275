"""SamplingParams (and RepetitionDetectionParams): per-request generation controls,
mirroring vllm/sampling_params.py.

Field names, defaults, normalisation (__post_init__) and validation messages follow
vLLM 0.33. The model-dependent checks (vocab bounds, --max-logprobs) run in verify(),
and eos / bad-word tokenization in update_from_generation_config / update_from_tokenizer,
which LLMEngine.add_request calls on its own clone (vLLM's input processor). Only fields
the sampler implements exist, so a caller can never set a knob that is silently ignored.
"""

from __future__ import annotations

import copy
import enum
import math
from dataclasses import dataclass, field

from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.structured_output.params import StructuredOutputsParams

_SAMPLING_EPS = 1e-5
_MAX_TEMP = 1e-2
MAX_N_SEQUENCES = 16384  # VLLM_MAX_N_SEQUENCES
MAX_NUM_BAD_WORDS = 128  # VLLM_MAX_NUM_BAD_WORDS
MAX_LOGPROB_TOKEN_IDS = 128  # vllm/sampling_params.py
# a thinking budget's markers (engine/reasoning/config.py): start, forced end, natural end
ReasoningTokenIds = tuple[list[int], list[int], list[int]]


class RequestOutputKind(enum.IntEnum):
    CUMULATIVE = 0  # every output carries all text/tokens so far
    DELTA = 1  # only what is new since the previous output
    FINAL_ONLY = 2  # nothing until the request finishes


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


@dataclass
class RepetitionDetectionParams:
    """Ends a request whose output tail repeats an n-gram (vLLM's RepetitionDetectionParams;
    engine/core/sched_utils.py check_sequence_repetition). All 0: off."""
    max_pattern_size: int = 0  # the longest n-gram looked for; 0: off
    min_pattern_size: int = 0  # the shortest; 0 means 1
    min_count: int = 0  # repeats that end the request (>= 2 when on)

    def __post_init__(self) -> None:
        for name in ("max_pattern_size", "min_pattern_size", "min_count"):
            if not _is_int(getattr(self, name)):
                raise InvalidArgumentError(f"repetition_detection.{name} must be an integer, "
                                           f"got {type(getattr(self, name)).__name__}")
        if self.max_pattern_size < 0 or self.min_pattern_size < 0 or \
                self.min_pattern_size > self.max_pattern_size:
            raise InvalidArgumentError(
                "max_pattern_size, min_pattern_size must be >=0, with min_pattern_size <= "
                "max_pattern_size. Set both to 0 to disable repetitive pattern detection.")
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise InvalidArgumentError(
                "min_count must be >= 2 to detect repetitive patterns in engine output. If "
                "you do not wish to detect repetitive patterns, set max_pattern_size to 0.")

    @staticmethod
    def from_json(value: object) -> RepetitionDetectionParams:
        """A request's JSON object; keys other than the three are ignored (pydantic)."""
        if not isinstance(value, dict):
            raise InvalidArgumentError(
                f"repetition_detection must be an object, got {type(value).__name__}")
        names = ("max_pattern_size", "min_pattern_size", "min_count")
        return RepetitionDetectionParams(**{k: v for k, v in value.items() if k in names})


def check_num_logprob_token_ids(n: int) -> None:
    """vLLM's limit on logprob_token_ids (also checked before the C ABI reads them)."""
    if n > MAX_LOGPROB_TOKEN_IDS:
        raise InvalidArgumentError(
            f"Requested logprob_token_ids of length {n}, which is greater than max allowed: "
            f"{MAX_LOGPROB_TOKEN_IDS}")


def validate_thinking_token_budget(value: object) -> int | None:
    """None / -1: unlimited (None); else an int >= 0 (vLLM's validator: no bool, float or
    string coercion)."""
    if value is None or value == -1 and _is_int(value):
        return None
    if not _is_int(value) or value < 0:
        raise InvalidArgumentError(
            "`thinking_token_budget` must be a non-negative integer or -1 for unlimited.")
    return value


def verify_num_sequences(value, name: str) -> None:
    """n or a beam width: an int in [1, VLLM_MAX_N_SEQUENCES] (vLLM's
    _verify_num_sequences)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an int, but is of type {type(value)}")
    if value < 1:
        raise InvalidArgumentError(f"{name} must be at least 1, got {value}.")
    if value > MAX_N_SEQUENCES:
        raise InvalidArgumentError(
            f"{name} must be at most {MAX_N_SEQUENCES}, got {value}. To increase this "
            "limit, set the VLLM_MAX_N_SEQUENCES environment variable.")


@dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
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
    logprobs: int | None = None  # top-k per output token (+ the sampled one); -1: vocab
    prompt_logprobs: int | None = None  # the same per prompt token
    # these ids' logprobs per output token instead of the top-k (+ the sampled one)
    logprob_token_ids: list[int] | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    stream_interval: int | None = None  # DELTA outputs every N new tokens (None: each step)
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    # reasoning tokens before the forced end of the block (-1 / None: unlimited;
    # engine/sample/ops/thinking_budget.py), needs the engine's reasoning markers
    thinking_token_budget: int | None = None
    # None: False; always True when prompt_logprobs are asked for (vLLM: only by default)
    skip_reading_prefix_cache: bool | None = None
    # json / regex / choice / grammar / json_object / structural_tag (engine/structured_output)
    structured_outputs: StructuredOutputsParams | None = None
    repetition_detection: RepetitionDetectionParams | None = None  # an n-gram loop ends it
    # Set in __post_init__ / by the engine (vLLM's private fields).
    output_text_buffer_length: int = field(default=0, init=False, repr=False)
    _eos_token_id: int | None = field(default=None, init=False, repr=False)
    _all_stop_token_ids: set[int] = field(default_factory=set, init=False, repr=False)
    _bad_words_token_ids: list[list[int]] | None = field(default=None, init=False, repr=False)
    # (start, forced end, natural end) marker ids, set with thinking_token_budget
    _reasoning_token_ids: ReasoningTokenIds | None = field(
        default=None, init=False, repr=False)

    @staticmethod
    def from_optional(**kwargs) -> SamplingParams:
        """The API-layer constructor: None means the default; logit_bias keys become
        ints and its values are clamped to [-100, 100] (vLLM's from_optional)."""
        for name in ("n", "presence_penalty", "frequency_penalty", "repetition_penalty",
                     "temperature", "top_p"):
            if kwargs.get(name) is None:
                kwargs[name] = getattr(SamplingParams, name)  # the field's default
        if kwargs.get("logit_bias") is not None:
            kwargs["logit_bias"] = _convert_logit_bias(kwargs["logit_bias"])
        if kwargs.get("repetition_detection") is not None and not isinstance(
                kwargs["repetition_detection"], RepetitionDetectionParams):
            kwargs["repetition_detection"] = RepetitionDetectionParams.from_json(
                kwargs["repetition_detection"])
        return SamplingParams(**kwargs)

    def __post_init__(self) -> None:
        _check_types(self)
        self.thinking_token_budget = validate_thinking_token_budget(self.thinking_token_budget)
        if 0 < self.temperature < _MAX_TEMP:
            self.temperature = _MAX_TEMP
        if self.seed == -1:
            self.seed = None
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids or []))
        self.bad_words = list(dict.fromkeys(self.bad_words or []))
        if self.stop and not self.include_stop_str_in_output:
            self.output_text_buffer_length = max(len(s) for s in self.stop) - 1
        self._verify_args()
        if self.temperature < _SAMPLING_EPS:  # greedy
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise InvalidArgumentError(f"n must be 1 when using greedy sampling, got {self.n}.")
        self._all_stop_token_ids.update(self.stop_token_ids)
        if self.prompt_logprobs is not None:  # a cached prefix has no logits to score
            self.skip_reading_prefix_cache = True
        elif self.skip_reading_prefix_cache is None:
            self.skip_reading_prefix_cache = False

    def _verify_args(self) -> None:
        err = InvalidArgumentError
        verify_num_sequences(self.n, "n")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise err(f"{name} must be in [-2, 2], got {getattr(self, name)}.")
        if not math.isfinite(self.repetition_penalty):
            raise err(f"repetition_penalty must be a finite number, got "
                      f"{self.repetition_penalty}.")
        if self.repetition_penalty <= 0.0:
            raise err(f"repetition_penalty must be greater than zero, got "
                      f"{self.repetition_penalty}.")
        if not math.isfinite(self.temperature):
            raise err(f"temperature must be a finite number, got {self.temperature}.")
        if self.temperature < 0.0:
            raise err(f"temperature must be non-negative, got {self.temperature}.")
        if self.temperature > 2.0:
            raise err(f"temperature must be in [0, 2], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise err(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise err(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise err(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise err(f"seed must fit in 64 bits, got {self.seed}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise err(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.stream_interval is not None and self.stream_interval < 1:
            raise err(f"stream_interval must be at least 1, got {self.stream_interval}.")
        if self.min_tokens < 0:
            raise err(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise err(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                      f"got {self.min_tokens}.")
        if self.logprobs is not None and self.logprobs != -1 and self.logprobs < 0:
            raise err(f"logprobs must be non-negative or -1, got {self.logprobs}.")
        if self.prompt_logprobs is not None and self.prompt_logprobs != -1 \
                and self.prompt_logprobs < 0:
            raise err(f"prompt_logprobs must be non-negative or -1, got {self.prompt_logprobs}.")
        if any(not s for s in self.stop):
            raise err("stop cannot contain an empty string.")
        if self.stop and not self.detokenize:
            raise err("stop strings are only supported when detokenize is True. "
                      "Set detokenize=True to use stop.")
        if any(not w for w in self.bad_words):
            raise err(f"bad_words cannot contain an empty string. Got bad_words={self.bad_words}")

    # ------------------------------------------------------------ engine-side

    def verify(self, vocab_size: int, max_logprobs: int) -> None:
        """Model-dependent checks (vLLM's SamplingParams.verify): logprob counts
        against --max-logprobs (-1: the vocab), token ids against the vocab."""
        max_lp = vocab_size if max_logprobs == -1 else max_logprobs
        for name, what in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
            if num := getattr(self, name):
                num = vocab_size if num == -1 else num
                if num > max_lp:
                    raise InvalidArgumentError(
                        f"Requested {what} logprobs of {num}, which is greater than max "
                        f"allowed: {max_lp}")
        ids = self.logprob_token_ids
        check_num_logprob_token_ids(len(ids or ()))
        for name in ("logprob_token_ids", "logit_bias", "stop_token_ids"):
            bad = [t for t in (getattr(self, name) or ()) if not 0 <= t < vocab_size]
            if bad:
                raise InvalidArgumentError(
                    f"token_id(s) {bad} in {name} contain out-of-vocab token ids. "
                    f"Vocabulary size: {vocab_size}")
        if ids is not None and self.logprobs is not None and self.logprobs != len(ids):
            raise InvalidArgumentError(
                "When both logprobs and logprob_token_ids are set, logprobs must equal "
                f"len(logprob_token_ids). Got logprobs={self.logprobs}, "
                f"len(logprob_token_ids)={len(ids)}.")
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise InvalidArgumentError("allowed_token_ids is not None and empty!")
            if any(not 0 <= t < vocab_size for t in self.allowed_token_ids):
                raise InvalidArgumentError("allowed_token_ids contains out-of-vocab token id!")

    def update_from_generation_config(self, generation_config: dict,
                                      eos_token_id: int | None = None) -> None:
        """The tokenizer's eos, and generation_config.json's eos_token_id (an int or a list)
        as stop ids but for that eos (vLLM: Llama 3 Instruct lists <|eot_id|> there)."""
        if not self.ignore_eos:
            self._eos_token_id = eos_token_id
        if eos_token_id is not None:  # min_tokens also masks eos
            self._all_stop_token_ids.add(eos_token_id)
        if (eos_ids := generation_config.get("eos_token_id")) is not None:
            eos_ids = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids)
            eos_ids.discard(eos_token_id)  # stopped on by the eos check itself
            if eos_ids:
                self._all_stop_token_ids.update(eos_ids)
                if not self.ignore_eos:
                    eos_ids.update(self.stop_token_ids)
                    self.stop_token_ids = list(eos_ids)

    def update_from_reasoning_config(
            self, ids: ReasoningTokenIds | None) -> None:
        """The engine's reasoning marker ids (engine/reasoning/config.py), which a
        thinking_token_budget needs (vLLM's input processor refuses it without them)."""
        if self.thinking_token_budget is None:
            return
        if ids is None:
            raise InvalidArgumentError(
                "thinking_token_budget is set but reasoning_config is not configured. Please "
                "set --reasoning-parser and/or --reasoning-config to use "
                "thinking_token_budget.")
        self._reasoning_token_ids = ids

    def update_from_tokenizer(self, tokenizer) -> None:
        """Bad words -> token id sequences, each word with and without a leading space
        (the spaced form kept only when it is a different word of the same length)."""
        if not self.bad_words:
            return
        self._bad_words_token_ids = []
        for bad_word in self.bad_words:
            for add_prefix_space in (False, True):
                prefix = " " if add_prefix_space else ""
                ids = tokenizer.encode(prefix + bad_word.lstrip(), add_special_tokens=False)
                if not ids:
                    if not add_prefix_space:
                        raise InvalidArgumentError(
                            "bad_words entries must tokenize to at least one token.")
                    continue
                last = self._bad_words_token_ids[-1] if add_prefix_space else None
                if last is None or (ids[0] != last[0] and len(ids) == len(last)):
                    self._bad_words_token_ids.append(ids)
                    if len(self._bad_words_token_ids) > MAX_NUM_BAD_WORDS:
                        raise InvalidArgumentError(
                            f"Too many bad words after tokenization: "
                            f"{len(self._bad_words_token_ids)}. The max number is "
                            f"{MAX_NUM_BAD_WORDS}.")
        max_id = tokenizer.vocab_size - 1
        bad = [t for ids in self._bad_words_token_ids for t in ids if not 0 <= t <= max_id]
        if bad:
            raise InvalidArgumentError(
                f"The model vocabulary size is {max_id + 1}, but the following tokens were "
                f"specified as bad: {bad}. All token id values should be integers satisfying: "
                f"0 <= token_id <= {max_id}.")

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def num_logprobs(self) -> int | None:
        """Sample logprobs a position (vLLM): logprobs, else len(logprob_token_ids)."""
        if self.logprobs is not None:
            return self.logprobs
        return len(self.logprob_token_ids) if self.logprob_token_ids else None

    @property
    def eos_token_id(self) -> int | None:
        return self._eos_token_id

    @property
    def all_stop_token_ids(self) -> set[int]:
        return self._all_stop_token_ids

    @property
    def bad_words_token_ids(self) -> list[list[int]] | None:
        return self._bad_words_token_ids

    @property
    def reasoning_token_ids(self) -> ReasoningTokenIds | None:
        return self._reasoning_token_ids

    def clone(self) -> SamplingParams:
        return copy.deepcopy(self)


# ---------------------------------------------------------------- type checks

_INTS = ("n", "top_k", "min_tokens")
_OPT_INTS = ("seed", "max_tokens", "stream_interval")
_FLOATS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature",
           "top_p", "min_p")
_BOOLS = ("ignore_eos", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
          "include_stop_str_in_output")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_types(sp: SamplingParams) -> None:
    """Hostile input gets a clear message instead of a TypeError deep in a comparison."""
    err = InvalidArgumentError
    for name in ("logprobs", "prompt_logprobs"):  # vLLM: True means 1 (False acts as 0)
        if isinstance(getattr(sp, name), bool):
            setattr(sp, name, int(getattr(sp, name)))
    if not _is_int(sp.n):
        raise err(f"n must be an int, but is of type {type(sp.n)}")
    if not _is_int(sp.top_k):
        raise err(f"top_k must be an integer, got {type(sp.top_k).__name__}")
    for name in _INTS + tuple(n for n in _OPT_INTS + ("logprobs", "prompt_logprobs")
                              if getattr(sp, n) is not None):
        if not _is_int(getattr(sp, name)):
            raise err(f"{name} must be an integer, got {type(getattr(sp, name)).__name__}")
    for name in _FLOATS:
        v = getattr(sp, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise err(f"{name} must be a number, got {type(v).__name__}")
    for name in _BOOLS + (("skip_reading_prefix_cache",) if sp.skip_reading_prefix_cache
                          is not None else ()):
        if not isinstance(getattr(sp, name), bool):
            raise err(f"{name} must be a bool, got {type(getattr(sp, name)).__name__}")
    try:
        sp.output_kind = RequestOutputKind(sp.output_kind)
    except ValueError:
        raise err(f"output_kind must be 0, 1 or 2, got {sp.output_kind!r}") from None
    _check_list(sp.stop, "stop", str, allow_single=True)
    _check_list(sp.bad_words, "bad_words", str)
    for name in ("stop_token_ids", "allowed_token_ids", "logprob_token_ids"):
        _check_list(getattr(sp, name), name, int)
    if sp.structured_outputs is not None and \
            not isinstance(sp.structured_outputs, StructuredOutputsParams):
        raise err("structured_outputs must be a StructuredOutputsParams, got "
                  f"{type(sp.structured_outputs).__name__}")
    if sp.repetition_detection is not None and \
            not isinstance(sp.repetition_detection, RepetitionDetectionParams):
        raise err("repetition_detection must be a RepetitionDetectionParams, got "
                  f"{type(sp.repetition_detection).__name__}")
    if sp.logit_bias is not None:
        if not isinstance(sp.logit_bias, dict):
            raise err(f"logit_bias must be a dict, got {type(sp.logit_bias).__name__}")
        if not all(_is_int(k) for k in sp.logit_bias):
            raise err(f"logit_bias keys must be integer token ids, got {list(sp.logit_bias)}")
        for v in sp.logit_bias.values():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise err(f"logit_bias values must be finite numbers, got {v!r}")


def _check_list(value: object, name: str, kind: type, allow_single: bool = False) -> None:
    if value is None or (allow_single and isinstance(value, kind)):
        return
    what = "integers" if kind is int else "strings"
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise InvalidArgumentError(f"{name} must contain only {what}, got {value!r}.")


def _convert_logit_bias(logit_bias: dict) -> dict:
    converted, invalid = {}, []
    for token, bias in logit_bias.items():
        try:
            token_id = int(token)
        except (ValueError, TypeError):
            invalid.append(token)
            continue
        is_num = isinstance(bias, (int, float)) and not isinstance(bias, bool)
        converted[token_id] = min(100.0, max(-100.0, bias)) if is_num else bias
    if invalid:
        raise InvalidArgumentError(
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: "
            f"{invalid!r}")
    return converted
