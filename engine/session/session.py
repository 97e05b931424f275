"""EngineSession: one engine and the front-end state around it, for every front end (the
C ABI's capi/, a Python program).

Owns, as vllm/entrypoints/llm.py's LLM owns its LLMEngine and vllm/v1/engine/async_llm.py
its output handler:
- the LLMEngine and, once started, the background loop (engine/async_llm.py AsyncLLM,
  one thread) sharing the session's lock (a FairRLock), so caller-driven calls and the
  loop never run the engine at the same time;
- the request counters and gauges (StatsCollector: vLLM's PrometheusStatLogger counters,
  vllm/v1/metrics/loggers.py), fed by every step whoever drives it;
- per-request timings (engine/session/request_times.py, vLLM's RequestStateStats);
- in caller-driven mode, the rule that routes outputs to the thread that added each
  request (engine/session/routing.py); in loop mode, the pulled requests whose last
  output was not taken yet (they count as unfinished);
- the model's description (engine/session/model_meta.py), tokenizing with or without
  special-token text (engine/session/plain_text.py), the chat template the session was
  created with (engine/session/create_checks.py).
Messages name the include/vllm.h functions: the C ABI is the front end that reaches
these states.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

from libvllm.engine import load_progress
from libvllm.engine.async_llm import AsyncLLM, RequestStream, StatsCollector
from libvllm.engine.config import EngineConfig
from libvllm.engine.errors import InvalidArgumentError, NotFoundError, UnsupportedError
from libvllm.engine.exceptions import EngineDeadError
from libvllm.engine.fair_lock import FairRLock
from libvllm.engine.llm_engine import EMBED_ON_GENERATE, LLMEngine
from libvllm.engine.pooling_params import PoolingParams
from libvllm.engine.sampling_params import RequestOutputKind, SamplingParams
from libvllm.engine.session import model_meta, plain_text
from libvllm.engine.session.create_checks import check_create_inputs, load_chat_template
from libvllm.engine.session.embed import run_caller_driven, run_loop, vectors
from libvllm.engine.session.errors import InvalidStateError
from libvllm.engine.session.request_times import RequestTimes
from libvllm.engine.session.routing import OutputRouter, RoutedOutput
from libvllm.engine.tokenizer import Tokenizer

Progress = Callable[[float], bool]  # fraction -> False to abort the load


def _load_aborted(fraction: float) -> load_progress.LoadCancelledError:
    return load_progress.LoadCancelledError(
        f"vllm_engine_create: the progress callback returned 0 at {fraction:g}: model load "
        "aborted")


@dataclass
class SubmittedRequest:
    """A request submitted to the background loop: its stream and timings."""

    stream: RequestStream
    times: RequestTimes
    session: EngineSession

    def last_event_taken(self) -> None:
        """Its last output was taken, or its handle freed: no longer unfinished."""
        self.session._awaiting_last_output.pop(id(self), None)


class EngineSession:
    def __init__(self, engine: LLMEngine, config: EngineConfig) -> None:
        self.engine = engine
        self.config = config
        self.lock = FairRLock()
        self.stats = StatsCollector()
        self.loop: AsyncLLM | None = None
        self._router = OutputRouter()
        # loop mode: id(SubmittedRequest) -> request id of the pulled requests whose last
        # output was not taken yet
        self._awaiting_last_output: dict[int, str] = {}
        self._info: model_meta.SessionModelInfo | None = None
        self._metadata: tuple[dict, int, int, bool] | None = None  # read_metadata's

    @classmethod
    def create(cls, config: EngineConfig, *, chat_template: str | None = None,
               progress: Progress | None = None) -> EngineSession:
        """Loads the engine. chat_template: a file, or the template text (vLLM's
        --chat-template); progress(fraction) is called with 0, per tensor read (a child
        engine core: per 1% of the load, engine/engine_core/load_progress_relay.py), and
        1."""
        template = None if chat_template is None else load_chat_template(chat_template)
        check_create_inputs(config.model, template)  # vLLM fails at start-up
        if progress is not None and not progress(0.0):
            raise _load_aborted(0.0)
        # no reporter, no per-tensor reports (a child core then loads without waiting on us)
        with load_progress.reporting(progress) if progress is not None else nullcontext():
            engine = LLMEngine.from_config(config)
        if template is not None:
            if engine.tokenizer is None:
                engine.shutdown()
                raise InvalidArgumentError("chat_template needs a tokenizer (skip_tokenizer_init)")
            engine.tokenizer.chat_template = template
        if progress is not None and not progress(1.0):
            engine.shutdown()
            raise _load_aborted(1.0)
        return cls(engine, config)

    # ---------------------------------------------------------------- lifecycle

    @property
    def served_model_name(self) -> str:
        return self.config.served_model_name or self.config.model

    @property
    def default_sampling_params(self) -> dict:
        """The model's generation_config.json defaults (vLLM get_diff_sampling_param)."""
        return self.engine.default_sampling_params

    def start_loop(self) -> AsyncLLM:
        """Starts the background loop (once); refused while caller-driven requests are
        unfinished."""
        with self.lock:
            if self.loop is None:
                if self._router.requests:
                    raise InvalidStateError(
                        f"{len(self._router.requests)} request(s) added with "
                        "vllm_request_add are unfinished: step or abort them before "
                        "vllm_engine_start_loop")
                self.loop = AsyncLLM(self.engine, stats=self.stats, lock=self.lock)
            return self.loop

    def require_loop(self, what: str) -> AsyncLLM:
        if self.loop is None:
            raise InvalidStateError(f"{what} needs the background loop: call "
                                    "vllm_engine_start_loop first")
        return self.loop

    def require_caller_driven(self, what: str) -> None:
        if self.loop is not None:
            raise InvalidStateError(f"{what} is not allowed while the background loop runs "
                                    "(use vllm_request_submit)")

    def shutdown(self) -> None:
        """Ends the loop (aborting what is live; the loop hands out the last outputs),
        then the engine (and its core process, if any)."""
        if self.loop is not None:
            self.loop.shutdown()
        with self.lock:
            self.engine.shutdown()

    # ---------------------------------------------------------------- caller-driven

    def add_request(self, request_id: str, prompt: str | list[int],
                    params: SamplingParams) -> None:
        """Adds a request owned by the calling thread (its outputs go to its steps).
        Outputs are DELTA (as the loop's): the timings count tokens from them."""
        params.output_kind = RequestOutputKind.DELTA
        with self.lock:
            self.require_caller_driven("vllm_request_add")
            self._router.check_new(request_id)
            times = RequestTimes.for_params(params)
            self.engine.add_request(request_id, prompt, params)
            self._router.added(request_id, times, threading.get_ident())

    def abort_request(self, request_id: str) -> None:
        with self.lock:
            if self.loop is not None:
                if not self.loop.has_request(request_id):
                    raise NotFoundError(f"no running request with id {request_id!r}")
                self.loop.abort(request_id)
            else:
                self.engine.abort_request(request_id)

    def step(self) -> list[RoutedOutput]:
        """Runs one engine step for every request; returns the calling thread's outputs
        (those of its requests, from this step and other threads' steps since its last)."""
        me = threading.get_ident()
        with self.lock:
            self.require_caller_driven("vllm_engine_step")
            engine = self.engine
            results = engine.step() if engine.has_unfinished_requests() else []
            self.stats.observe(results)
            self._router.route(results)
            mine = self._router.take(me)
            requests = self._router.requests
            if not results and not mine and requests and me not in self._router.adders:
                raise InvalidStateError(
                    f"vllm_engine_step: the engine's {len(requests)} unfinished request(s) "
                    "were added by other threads; their outputs go to the thread that added "
                    "each request (step there, or use the background loop)")
            return mine

    def num_unfinished(self) -> int:
        """Caller-driven: requests whose last output their owner has not taken. Loop:
        requests in the loop, plus pulled ones whose last output was not taken."""
        with self.lock:
            if self.loop is None:
                return len(self._router.requests)
            waiting = sum(1 for rid in self._awaiting_last_output.values()
                          if not self.loop.has_request(rid))
            return self.loop.num_unfinished() + waiting

    # ---------------------------------------------------------------- background loop

    def submit(self, request_id: str, prompt: str | list[int], params: SamplingParams, *,
               push: Callable[[object, RequestTimes], None] | None = None,
               pulled: bool = True) -> SubmittedRequest:
        """Adds a request to the background loop. push(output or error, times) gets each
        output; else the stream is pulled (pulled=False: nobody will pull it)."""
        loop = self.require_loop("vllm_request_submit")
        times = RequestTimes.for_params(params)
        on_output = None if push is None else (lambda item: push(item, times))
        stream = loop.add_request(request_id, prompt, params, on_output=on_output)
        request = SubmittedRequest(stream, times, self)
        if push is None and pulled:
            self._awaiting_last_output[id(request)] = request_id
        return request

    # ---------------------------------------------------------------- tokenizer

    def tokenizer(self) -> Tokenizer:
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise InvalidStateError("the engine has no tokenizer (skip_tokenizer_init)")
        return tokenizer

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids of text; parse_special=False: special-token text stays plain text."""
        tokenizer = self.tokenizer()
        if parse_special:
            return tokenizer.encode(text, add_special_tokens=add_special)
        return plain_text.encode(tokenizer, text, add_special=add_special)

    def detokenize(self, ids: list[int], *, skip_special_tokens: bool) -> str:
        return self.tokenizer().decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_piece(self, token: int, *, special: bool) -> bytes:
        """llama_token_to_piece: the bytes the token stands for; special tokens only on
        request."""
        tokenizer = self.tokenizer()
        data = tokenizer.id_to_bytes(token)  # checks the range
        return b"" if token in tokenizer.all_special_ids and not special else data

    def render_chat_template(self, messages: list[dict], *, add_generation_prompt: bool,
                             tools: list[dict] | None = None) -> str:
        with self.lock:
            return self.engine.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tools=tools)

    # ---------------------------------------------------------------- model, metrics, health

    def model_info(self) -> model_meta.SessionModelInfo:
        if self._info is None:
            kv, n_params, n_layers, is_gguf = self._read_metadata()
            self._info = model_meta.describe(self.engine, self.config, kv, n_params,
                                             n_layers, is_gguf)
        return self._info

    def model_metadata(self) -> dict:
        """The model's metadata key/values (GGUF keys, or config.json's), in file order."""
        return self._read_metadata()[0]

    def _read_metadata(self) -> tuple[dict, int, int, bool]:
        if self._metadata is None:
            self._metadata = model_meta.read_metadata(self.engine, self.config)
        return self._metadata

    def metrics(self) -> dict:
        """Counters since the engine started and gauges: the last step's while the loop
        runs (never waits for a step), else as of now."""
        if self.loop is not None:
            return self.loop.get_stats()
        with self.lock:
            return self.stats.snapshot(self.engine)

    def check_health(self) -> None:
        """Raises EngineDeadError once the engine died (vLLM's AsyncLLM.check_health);
        never takes the lock, so it never waits for a running step."""
        for target in (self.loop, self.engine):
            if target is not None:
                _check(target)

    def reset_prefix_cache(self) -> bool:
        """vLLM's LLMEngine.reset_prefix_cache: False while running requests hold blocks."""
        with self.lock:
            return self.engine.reset_prefix_cache()

    # ---------------------------------------------------------------- pooling

    def require_pooling(self) -> None:
        if self.engine.runner_type != "pooling":
            raise UnsupportedError(EMBED_ON_GENERATE)

    def pooling_params(self, dimensions: int | None) -> tuple[PoolingParams, int]:
        """The embed task's params and its vector size (known before anything runs)."""
        self.require_pooling()
        engine = self.engine
        params = PoolingParams(dimensions=dimensions, task="embed")
        return params, engine.verify_pooling_params(params).dimensions or engine.hidden_size

    def embed(self, prompts: list[str | list[int]], params: PoolingParams) -> list:
        """One vector per prompt (vLLM's LLM.embed)."""
        if self.loop is not None:
            outputs = run_loop(self.loop, prompts, params)
        else:
            with self.lock:
                outputs = run_caller_driven(self.engine, prompts, params)
        return vectors(outputs)


def _known_death(target) -> EngineDeadError | None:
    """The error state kept by an AsyncLLM (_dead) or by an LLMEngine's multiprocess
    core client (dead); None: no error recorded (an in-process core)."""
    dead = getattr(target, "_dead", None)
    if dead is None:
        dead = getattr(getattr(target, "engine_core", None), "dead", None)
    return dead


def _check(target) -> None:
    """The target's own check_health where it has one, else its recorded death."""
    check = getattr(target, "check_health", None)
    if check is not None:
        check()
        return
    dead = _known_death(target)
    if dead is not None:
        raise dead
