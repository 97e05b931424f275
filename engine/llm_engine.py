"""LLMEngine: the synchronous engine the C ABI drives, as vllm/v1/engine/llm_engine.py.

The front end of the engine: input processing (tokenization, prompt and params checks,
n > 1 fan-out: engine/input_processor.py, engine/parallel_sampling.py), the
OutputProcessor (detokenization, stop strings, logprobs shaping) and the metrics
aggregation, over an EngineCoreClient (engine/engine_core/core_client.py) behind which the
engine core (scheduler, KV cache, grammar manager, model runner; engine/core/
engine_core.py) runs in this process (InprocClient) or in a child process
(SyncMPClient, engine/engine_core/core_client_mp.py; EngineConfig.multiprocessing).
add_request -> EngineCoreRequest -> core; step() -> the core's EngineCoreOutputs ->
RequestOutputs. Requests a stop string finished are aborted in the core.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from libvllm.engine.chat_template import render_chat_template
from libvllm.engine.config import EngineConfig
from libvllm.engine.engine_core.client_factory import make_client
from libvllm.engine.engine_core.core_client import EngineCoreClient, InprocClient
from libvllm.engine.engine_core.engine_core_messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    error_from_wire,
)
from libvllm.engine.errors import InvalidArgumentError, NotFoundError, UnsupportedError
from libvllm.engine.input_processor import InputProcessor
from libvllm.engine.output_processor import OutputProcessor
from libvllm.engine.outputs import PoolingOutput, PoolingRequestOutput, RequestOutput
from libvllm.engine.parallel_sampling import ParentRequest
from libvllm.engine.pooling_params import PoolingParams
from libvllm.engine.request import validate_cache_salt
from libvllm.engine.sampling_params import SamplingParams
from libvllm.engine.stats_aggregator import EngineStats, StatsAggregator
from libvllm.engine.tokenizer import Tokenizer


@dataclass
class ModelInfo:
    architecture: str
    name: str
    vocab_size: int
    max_model_len: int
    bos_token_id: int  # -1: none
    eos_token_id: int  # -1: none


# vLLM's refusals (vllm/entrypoints/llm.py, vllm/entrypoints/pooling/offline.py)
GENERATE_ON_POOLING = ("LLM.generate() is only supported for generative models. Try passing "
                       "`--runner generate` to use the model as a generative model.")
EMBED_ON_GENERATE = ("Embedding API is not supported by this model. Try converting the model "
                     "using `--convert embed`.")
_RECENT_IDS = 4096  # finished or aborted user ids a reuse of which gets a fresh core id


class LLMEngine:
    def __init__(self, config: EngineConfig, engine_core: EngineCoreClient,
                 tokenizer: Tokenizer | None) -> None:
        self.config = config
        self.engine_core = engine_core
        self.tokenizer = tokenizer
        ready = engine_core.ready
        self.resolved = ready.config  # what the core resolved at start-up (vLLM's handshake)
        self.max_model_len = ready.max_model_len
        self.cudagraph_capture_time_s = ready.cudagraph_capture_time_s
        self.memory_profile = ready.memory_profile  # bytes (CUDA), as the core measured
        self.input_processor = InputProcessor(config, ready, tokenizer)
        self.stats = StatsAggregator()
        self.output_processor = OutputProcessor(tokenizer)
        self.max_logprobs = config.max_logprobs  # -1: the whole vocab
        self._pending_outputs: list[RequestOutput] = []
        # A user id reused soon after it finished or was aborted gets a fresh core id, so
        # that outputs of the old request still in flight from a child core never reach
        # the new one (vLLM gives every request an internal id, InputProcessor).
        self._recent: OrderedDict[str, None] = OrderedDict()  # user ids, newest last
        self._core_ids: dict[str, str] = {}  # user id -> core id, where they differ
        self._user_ids: dict[str, str] = {}  # core id -> user id, where they differ
        self._renames = 0
        self._pooling: dict[str, list[int]] = {}  # live pooling requests (core id -> prompt)
        self.runner_type = self.resolved.runner_type  # generate | pooling
        self.hidden_size = ready.hidden_size  # the pooled vector's size
        self._matryoshka = (ready.matryoshka_dimensions, ready.is_matryoshka)
        # the model's generation_config.json defaults (vLLM ModelConfig.get_diff_sampling_param)
        self.default_sampling_params: dict = dict(ready.default_sampling_params)
        self.model_info = ModelInfo(
            ready.architecture, config.served_model_name or ready.name, ready.vocab_size,
            self.max_model_len, _or_neg(tokenizer and tokenizer.bos_token_id),
            _or_neg(self.eos_token_id))

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's eos id; None without a tokenizer (vLLM's InputPreprocessor)."""
        return None if self.tokenizer is None else self.tokenizer.eos_token_id

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        client, tokenizer = make_client(config)
        try:
            return cls(config, client, tokenizer)
        except BaseException:  # e.g. markers the vocabulary lacks: no core left running
            client.shutdown()
            raise

    @property
    def is_multiprocess(self) -> bool:
        return self.engine_core.is_multiprocess

    # the in-process core's parts (tests and benchmarks look inside; not in MP mode)
    @property
    def scheduler(self):
        return self._inproc_core().scheduler

    @property
    def model_runner(self):
        return self._inproc_core().model_runner

    @property
    def structured_output_manager(self):
        return self._inproc_core().structured_output_manager

    @property
    def batch_queue_size(self) -> int:
        return 2 if self.resolved.scheduler.async_scheduling else 1

    def _inproc_core(self):
        if not isinstance(self.engine_core, InprocClient):
            raise AttributeError("the engine core runs in a child process")
        return self.engine_core.engine_core

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        if self.tokenizer is None or not self.tokenizer.chat_template:
            raise InvalidArgumentError("the model has no chat template")
        return render_chat_template(
            self.tokenizer.chat_template, messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.tokenizer.bos_token or "", eos_token=self.tokenizer.eos_token or "",
            tools=tools)

    def add_request(self, request_id: str, prompt: str | list[int],
                    params: SamplingParams, priority: int = 0,
                    cache_salt: str | None = None,
                    reasoning_parser_kwargs: dict | None = None) -> None:
        """Queue a request. params is cloned and completed (vLLM's input processor);
        n > 1 fans out into n child requests (engine/parallel_sampling.py) whose
        outputs come back under request_id. reasoning_parser_kwargs (e.g. the chat
        template's enable_thinking) reach the reasoning parser that gates the grammar."""
        if not isinstance(request_id, str) or not request_id:
            raise InvalidArgumentError("request_id must be a non-empty string")
        validate_cache_salt(cache_salt)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidArgumentError(f"priority must be an int, got {type(priority).__name__}")
        if not isinstance(params, SamplingParams):
            raise InvalidArgumentError(
                f"params must be a SamplingParams, got {type(params).__name__}")
        if self.runner_type == "pooling":
            raise UnsupportedError(GENERATE_ON_POOLING)
        processor = self.input_processor
        ids = processor.tokenize(prompt)
        params = processor.process_params(params, len(ids))
        processor.check_fits_kv_cache(request_id, len(ids), params.max_tokens)
        if request_id in self._core_ids or self.output_processor.has_request(request_id):
            raise InvalidArgumentError(f"request id {request_id!r} is already in use")
        core_id = request_id
        if request_id in self._recent:
            self._renames += 1
            core_id = f"{request_id}-{self._renames}"
        parent = ParentRequest(core_id, params) if params.n > 1 else None
        children = [parent.get_child_info(i) for i in range(params.n)] if parent \
            else [(core_id, params)]
        for rid in {core_id, *(rid for rid, _ in children)}:
            if self.output_processor.has_request(rid):
                raise InvalidArgumentError(f"request id {rid!r} is already in use")
        if core_id != request_id:
            self._core_ids[request_id], self._user_ids[core_id] = core_id, request_id
        now = time.time()
        text = prompt if isinstance(prompt, str) else None
        try:
            for index, (rid, sp) in enumerate(children):
                request = EngineCoreRequest(rid, ids, sp, now, priority, cache_salt,
                                            reasoning_parser_kwargs)
                self.output_processor.add_request(request, text, parent, index)
                self.engine_core.add_request(request)
        except BaseException:  # e.g. the core died: forget the request here too
            self.output_processor.abort_requests([rid for rid, _ in children])
            self._finish_ids(request_id)
            raise

    def verify_pooling_params(self, params: PoolingParams) -> PoolingParams:
        """`params` completed and checked against this model (vLLM's PoolingParams.verify:
        `dimensions` only on a matryoshka model, within its sizes)."""
        return params.verify(self.config.resolved_pooler(), self.model_info.name,
                             self.hidden_size, *self._matryoshka)

    def add_pooling_request(self, request_id: str, prompt: str | list[int],
                            params: PoolingParams) -> None:
        """Queue a pooling request (vLLM's LLMEngine.add_request with PoolingParams): its
        prompt runs once; its one PoolingRequestOutput comes from step()."""
        if self.runner_type != "pooling":
            raise UnsupportedError(EMBED_ON_GENERATE)
        if not isinstance(request_id, str) or not request_id:
            raise InvalidArgumentError("request_id must be a non-empty string")
        if not isinstance(params, PoolingParams):
            raise InvalidArgumentError(
                f"params must be a PoolingParams, got {type(params).__name__}")
        params = self.verify_pooling_params(params)
        ids = self.input_processor.tokenize(prompt)
        if request_id in self._core_ids or request_id in self._pooling or \
                self.output_processor.has_request(request_id):
            raise InvalidArgumentError(f"request id {request_id!r} is already in use")
        self.input_processor.check_fits_kv_cache(request_id, len(ids), 1)
        # one placeholder token ends it (engine/worker/pooling_runner.py)
        sp = self.input_processor.process_params(
            SamplingParams(max_tokens=1, temperature=0.0, detokenize=False), len(ids))
        core_id = request_id
        if request_id in self._recent:
            self._renames += 1
            core_id = f"{request_id}-{self._renames}"
            self._core_ids[request_id], self._user_ids[core_id] = core_id, request_id
        self._pooling[core_id] = ids
        try:
            self.engine_core.add_request(EngineCoreRequest(
                core_id, ids, sp, time.time(), pooling_params=params))
        except BaseException:
            del self._pooling[core_id]
            self._finish_ids(request_id)
            raise

    def abort_request(self, request_id: str) -> None:
        """Abort a request (all children of an n > 1 request); its last output, with
        finish_reason "abort", comes with the next step()."""
        core_id = self._core_ids.get(request_id, request_id)
        if core_id in self._pooling:
            self._pending_outputs += self._to_user([self._pooled(core_id, None)])
            self.engine_core.abort_requests([core_id])
            return
        live = self.output_processor.child_request_ids(core_id)
        if not live:
            raise NotFoundError(f"no running request with id {request_id!r}")
        self._pending_outputs.extend(self._to_user(self.output_processor.abort_requests(live)))
        self.engine_core.abort_requests(live)

    def step(self) -> list[RequestOutput]:
        """The outputs of the next core step (in process: schedule and run it; with a
        child core: wait for its next step), and those of requests aborted since."""
        outputs, self._pending_outputs = self._pending_outputs, []
        if self.output_processor.has_unfinished_requests() or self._pooling or \
                self.engine_core.has_work():
            outputs += self.process_engine_core_outputs(self.engine_core.get_output())
        return outputs

    def process_engine_core_outputs(self, core_outputs: EngineCoreOutputs | None
                                    ) -> list[RequestOutput]:
        """RequestOutputs of one core step (vLLM's OutputProcessor.process_outputs);
        requests a stop string finished are aborted in the core."""
        if core_outputs is None:
            return []
        pooled = [self._pooled(o.request_id, o) for o in core_outputs.outputs
                  if o.request_id in self._pooling]
        outputs, stopped = self.output_processor.process_outputs(
            [o for o in core_outputs.outputs if o.request_id not in self._pooling])
        if stopped:
            self.engine_core.abort_requests(stopped)
        outputs = self._to_user(outputs + pooled)
        self.stats.observe(core_outputs.scheduler_stats, core_outputs.num_preemptions)
        return outputs

    def _pooled(self, core_id: str, out: EngineCoreOutput | None) -> PoolingRequestOutput:
        """The PoolingRequestOutput of a finished pooling request (None: aborted)."""
        ids = self._pooling.pop(core_id)
        if out is None or out.error is not None:
            return PoolingRequestOutput(core_id, None, ids, error=out and error_from_wire(
                out.error))
        data = None if out.pooling_output is None else PoolingOutput(out.pooling_output)
        return PoolingRequestOutput(core_id, data, ids, max(out.num_cached_tokens, 0))

    def _to_user(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Outputs under their user ids; a finished request's id becomes recent."""
        for out in outputs:
            out.request_id = self._user_ids.get(out.request_id, out.request_id)
            if out.finished:
                self._finish_ids(out.request_id)
        return outputs

    def _finish_ids(self, request_id: str) -> None:
        core_id = self._core_ids.pop(request_id, None)
        self._user_ids.pop(core_id, None)
        self._recent[request_id] = None
        self._recent.move_to_end(request_id)
        while len(self._recent) > _RECENT_IDS:
            self._recent.popitem(last=False)

    def take_pending_outputs(self) -> list[RequestOutput]:
        """The last outputs of requests aborted since the previous step."""
        outputs, self._pending_outputs = self._pending_outputs, []
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self._pending_outputs) or self.output_processor.has_unfinished_requests() \
            or bool(self._pooling) or self.engine_core.has_work()

    def get_stats(self) -> EngineStats:
        """Cumulative metrics for vllm.h (vLLM's Prometheus gauges and counters):
        running/waiting requests, KV cache usage, prefix-cache queries/hits/hit rate,
        preemptions. Refreshes the gauges (an abort may have happened since the step)."""
        stats = self.engine_core.make_stats()
        self.stats.observe(stats.scheduler_stats, stats.num_preemptions)
        return self.stats.stats

    def check_health(self) -> None:
        """vLLM's check_health: raises EngineDeadError once the engine core died (a
        child core process that was killed); takes no lock and sends nothing."""
        self.engine_core.check_health()

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM LLM.get_default_sampling_params: SamplingParams with the model's
        generation_config.json defaults (vLLM's own defaults where it is silent)."""
        return SamplingParams(**self.default_sampling_params)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM LLMEngine.reset_prefix_cache: False while running requests hold blocks."""
        return self.engine_core.reset_prefix_cache(reset_running_requests)

    def peak_memory_bytes(self) -> int:
        """The engine core's peak GPU memory (torch allocator; in its own process when it
        runs in a child); 0 on CPU."""
        return self.engine_core.peak_memory_bytes()

    def get_num_unfinished_requests(self) -> int:
        return len(self.output_processor.request_states)

    def shutdown(self) -> None:
        """Forget what is live and stop the core (the child process, if any)."""
        self.output_processor.abort_requests(list(self.output_processor.request_states))
        self._pending_outputs = []
        self._pooling.clear()
        self.engine_core.shutdown()


def _or_neg(v: int | None) -> int:
    return -1 if v is None else v
