"""LLMEngine: the synchronous engine the C ABI drives, as vllm/v1/engine/llm_engine.py.

add_request (input processing + validation, structured-output grammar compile started)
-> Scheduler.schedule -> grammar bitmask -> ModelRunner -> Scheduler.update_from_output
-> OutputProcessor (detokenize, stop strings) -> RequestOutput list from step().
Everything runs in-process; the engine-core process split of vLLM v1 is not done yet.
Async scheduling (on by default on CUDA) is vLLM's EngineCore.step_with_batch_queue: a
queue of two steps, so step N+1 is scheduled and queued on the device before the output
of step N is waited for and processed (engine/core/async_scheduler.py).
Start-up follows vLLM's engine core: load the model (load_format auto | dummy), profile
the activation peak on CUDA and size the KV cache from gpu_memory_utilization
(kv_cache_memory_bytes overrides), allocate and bind the cache, capture the decode CUDA
graphs (not with enforce_eager). On CUDA a GGUF model's quantized linear weights stay
quantized (GGUF GEMV/GEMM kernels).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

from engine.chat_template import render_chat_template
from engine.config import EngineConfig
from engine.core.async_scheduler import AsyncScheduler
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.kv_cache_utils import get_num_kv_blocks
from engine.core.sched_output import SchedulerOutput
from engine.core.scheduler import Scheduler
from engine.errors import InvalidArgumentError, NotFoundError
from engine.metrics import EngineStats, StatsAggregator
from engine.model_loader import load_model
from engine.models.config import ModelArchConfig, get_diff_sampling_param
from engine.output_processor import OutputProcessor
from engine.outputs import EngineCoreOutput, RequestOutput
from engine.parallel_sampling import ParentRequest
from engine.request import Request, RequestStatus, validate_cache_salt
from engine.sampling_params import SamplingParams
from engine.structured_output import (
    StructuredOutputManager,
    StructuredOutputRequest,
    StructuredOutputsConfig,
)
from engine.tokenizer import Tokenizer
from engine.worker.gpu_worker import determine_available_memory
from engine.worker.model_runner import (
    AsyncModelRunnerOutput,
    ModelRunner,
    SampledModelRunnerOutput,
)

_CPU_KV_CACHE_BYTES = 4 << 30  # vLLM's VLLM_CPU_KVCACHE_SPACE default (4 GiB)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelInfo:
    architecture: str
    name: str
    vocab_size: int
    max_model_len: int
    bos_token_id: int  # -1: none
    eos_token_id: int  # -1: none


class LLMEngine:
    def __init__(self, config: EngineConfig, model: torch.nn.Module, arch: ModelArchConfig,
                 tokenizer: Tokenizer | None, device: torch.device, dtype: torch.dtype) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.device = device
        self.max_model_len = config.max_model_len or arch.max_position_embeddings
        if self.max_model_len > arch.max_position_embeddings:
            raise InvalidArgumentError(
                f"max_model_len ({self.max_model_len}) is greater than the model's context "
                f"length ({arch.max_position_embeddings})")
        if not config.max_num_batched_tokens:
            config.max_num_batched_tokens = 8192 if config.enable_chunked_prefill else max(
                self.max_model_len, 2048)
        config.verify_max_model_len(self.max_model_len)  # vLLM's SchedulerConfig checks
        self.model_runner = ModelRunner(
            model, None, device, config.block_size, max_num_reqs=config.max_num_seqs,
            max_num_tokens=config.max_num_batched_tokens, max_model_len=self.max_model_len)
        num_blocks = self._num_kv_blocks(arch, dtype)
        shape = (2, num_blocks, config.block_size, arch.num_key_value_heads, arch.head_dim)
        kv_caches = [torch.empty(shape, dtype=dtype, device=device)
                     for _ in range(arch.num_hidden_layers)]
        self.model_runner.initialize_kv_cache(kv_caches)
        # decode CUDA graphs, captured at start-up (vLLM's capture_model); 0.0 without
        self.cudagraph_capture_time_s = self.model_runner.capture_model(
            config.cudagraph_batch_sizes())
        kv = KVCacheManager(num_blocks, config.block_size, self.max_model_len,
                            config.enable_prefix_caching, watermark=config.watermark)
        self.structured_output_manager = None if tokenizer is None else \
            _structured_output_manager(config, tokenizer, arch.vocab_size)
        if config.async_scheduling is None:  # vLLM: on unless incompatible; ours: CUDA
            config.async_scheduling = device.type == "cuda"
        scheduler_cls = AsyncScheduler if config.async_scheduling else Scheduler
        self.scheduler = scheduler_cls(config, kv, self.max_model_len,
                                       structured_output_manager=self.structured_output_manager)
        # steps queued on the device whose output is not processed yet, newest first
        self.batch_queue: deque[tuple[AsyncModelRunnerOutput, SchedulerOutput]] = deque()
        self.batch_queue_size = 2 if config.async_scheduling else 1
        self.stats = StatsAggregator()
        self.output_processor = OutputProcessor(tokenizer)
        self.max_logprobs = config.max_logprobs  # -1: the whole vocab
        self._pending_outputs: list[RequestOutput] = []
        # the model's generation_config.json defaults (vLLM ModelConfig.get_diff_sampling_param)
        self.default_sampling_params: dict = get_diff_sampling_param(arch.generation_config)
        self.model_info = ModelInfo(
            arch.architecture, config.served_model_name or arch.name, arch.vocab_size,
            self.max_model_len, _or_neg(tokenizer and tokenizer.bos_token_id),
            _or_neg(self.eos_token_id))

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's eos id; None without a tokenizer (vLLM's InputPreprocessor)."""
        return None if self.tokenizer is None else self.tokenizer.eos_token_id

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        device = torch.device("cuda" if config.device == "cuda" or (
            config.device == "auto" and torch.cuda.is_available()) else "cpu")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise InvalidArgumentError("device 'cuda' requested but CUDA is not available")
        dtype = _DTYPES.get(config.dtype) or (
            torch.bfloat16 if device.type == "cuda" else torch.float32)
        torch.manual_seed(config.seed)
        model, arch, source = load_model(config.model, config.load_format, device, dtype)
        if config.skip_tokenizer_init:  # vLLM: token-id prompts, token-id outputs
            tokenizer = None
        elif config.tokenizer is not None:  # vLLM --tokenizer
            tokenizer = Tokenizer.from_hf_dir(config.tokenizer)
        elif isinstance(source, str):  # a Hugging Face directory
            tokenizer = Tokenizer.from_hf_dir(source)
        else:
            tokenizer = Tokenizer.from_gguf_metadata(source.metadata)
        if not isinstance(source, str):
            source.close()
        model = model.to(device=device, dtype=dtype)
        return cls(config, model, arch, tokenizer, device, dtype)

    def _num_kv_blocks(self, arch: ModelArchConfig, dtype: torch.dtype) -> int:
        bs = self.config.block_size
        block_bytes = (2 * arch.num_hidden_layers * bs * arch.num_key_value_heads
                       * arch.head_dim * torch.finfo(dtype).bits // 8)
        budget = self.config.kv_cache_memory_bytes
        if not budget:
            if self.device.type == "cuda":  # vLLM's profile run + gpu_memory_utilization
                budget = determine_available_memory(
                    self.model_runner, self.config.max_num_batched_tokens,
                    self.config.gpu_memory_utilization)
            else:  # the CPU default, capped at what max_num_seqs full contexts need
                need = self.config.max_num_seqs * (-(-self.max_model_len // bs) + 1) * block_bytes
                budget = min(_CPU_KV_CACHE_BYTES, need)
        return get_num_kv_blocks(budget, block_bytes, bs, self.max_model_len)

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
        text = prompt if isinstance(prompt, str) else None
        if text is not None and self.tokenizer is None:
            raise InvalidArgumentError(
                "You cannot pass text prompts when `skip_tokenizer_init=True`")
        ids = self.tokenizer.encode(prompt) if text is not None else list(prompt)
        self._validate_prompt(ids)
        params = self._process_params(params, len(ids))
        parent = ParentRequest(request_id, params) if params.n > 1 else None
        children = [parent.get_child_info(i) for i in range(params.n)] if parent \
            else [(request_id, params)]
        for rid in {request_id, *(rid for rid, _ in children)}:
            if rid in self.scheduler.requests or self.output_processor.has_request(rid):
                raise InvalidArgumentError(f"request id {rid!r} is already in use")
        now = time.time()
        for index, (rid, sp) in enumerate(children):
            so_request = None if sp.structured_outputs is None else StructuredOutputRequest(
                sp.structured_outputs, rid, set(sp.all_stop_token_ids), ids,
                reasoning_parser_kwargs)
            req = Request(rid, ids, sp, self.eos_token_id, now,
                          self.config.block_size, priority=priority, cache_salt=cache_salt,
                          structured_output_request=so_request)
            if so_request is not None:  # compiles on the manager's threads
                self.structured_output_manager.grammar_init(so_request)
            self.scheduler.add_request(req)
            self.output_processor.add_request(req, text, parent, index)

    def _process_params(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        sp = params.clone()
        sp.verify(self.model_info.vocab_size, self.max_logprobs)
        if sp.max_tokens is None:  # up to the context length
            sp.max_tokens = self.max_model_len - prompt_len
            if sp.min_tokens > sp.max_tokens:
                raise InvalidArgumentError(
                    f"min_tokens must be less than or equal to max_tokens={sp.max_tokens}, "
                    f"got {sp.min_tokens}.")
        sp.update_from_generation_config(self.eos_token_id)
        if self.tokenizer is not None:
            sp.update_from_tokenizer(self.tokenizer)
        if sp.structured_outputs is not None:  # vLLM's _validate_structured_output
            if self.structured_output_manager is None:
                raise InvalidArgumentError("Structured outputs requires a tokenizer so it "
                                           "can't be used with 'skip_tokenizer_init'")
            self.structured_output_manager.validate(sp.structured_outputs)
        return sp

    def _validate_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise InvalidArgumentError("The decoder prompt cannot be empty")
        vocab = self.model_info.vocab_size
        bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidArgumentError(f"Token id {bad} is out of vocabulary")
        if len(ids) >= self.max_model_len:
            raise InvalidArgumentError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model "
                f"length of {self.max_model_len}. Make sure that `max_model_len` is no smaller "
                f"than the number of text tokens plus the generated tokens.")

    def abort_request(self, request_id: str) -> None:
        """Abort a request (all children of an n > 1 request); its last output, with
        finish_reason "abort", comes with the next step()."""
        live = self.output_processor.child_request_ids(request_id)
        if not live:
            raise NotFoundError(f"no running request with id {request_id!r}")
        done = self.scheduler.finish_requests(live, RequestStatus.FINISHED_ABORTED)
        self._pending_outputs.extend(self.output_processor.abort_requests(done))

    def step(self) -> list[RequestOutput]:
        """Schedule and queue a step; unless the batch queue still has room (async
        scheduling), wait for the oldest step queued and return its outputs."""
        outputs, self._pending_outputs = self._pending_outputs, []
        queue = self.batch_queue
        if self.scheduler.has_unfinished_requests():
            sched_out = self.scheduler.schedule()
            if sched_out.pending_output_tokens and queue:  # its sampling needs that output
                outputs += self._process_step(*queue.pop())
            grammar_output = self.scheduler.get_grammar_bitmask(sched_out)
            queue.appendleft((self.model_runner.execute_model_async(sched_out, grammar_output),
                              sched_out))
            if len(queue) < self.batch_queue_size and sched_out.total_num_scheduled_tokens:
                return outputs
        if queue:
            outputs += self._process_step(*queue.pop())
        return outputs

    def _process_step(self, future: AsyncModelRunnerOutput, sched_out: SchedulerOutput
                      ) -> list[RequestOutput]:
        """Wait for a queued step's output: scheduler update, stop checks, outputs."""
        runner_out = future.get_output()
        results = self.scheduler.update_from_output(sched_out, runner_out)
        results += [(req, []) for req in self.scheduler.take_errored_requests()]
        new_outputs, stopped = self.output_processor.process_outputs(
            _engine_core_outputs(results, runner_out))
        self.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        self.stats.observe(self.scheduler.make_stats(), self.scheduler.num_preemptions)
        return new_outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self._pending_outputs or self.batch_queue) or \
            self.scheduler.has_unfinished_requests()

    def get_stats(self) -> EngineStats:
        """Cumulative metrics for vllm.h (vLLM's Prometheus gauges and counters):
        running/waiting requests, KV cache usage, prefix-cache queries/hits/hit rate,
        preemptions. Refreshes the gauges (an abort may have happened since the step)."""
        self.stats.observe(self.scheduler.make_stats(), self.scheduler.num_preemptions)
        return self.stats.stats

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM LLM.get_default_sampling_params: SamplingParams with the model's
        generation_config.json defaults (vLLM's own defaults where it is silent)."""
        return SamplingParams(**self.default_sampling_params)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM LLMEngine.reset_prefix_cache: False while running requests hold blocks."""
        return self.scheduler.reset_prefix_cache(reset_running_requests)

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    def shutdown(self) -> None:
        for req_id in list(self.output_processor.request_states):
            self.abort_request(req_id)
        while self.batch_queue:  # wait for the device; the outputs are of aborted requests
            self.batch_queue.pop()[0].get_output()
        self._pending_outputs = []
        if self.structured_output_manager is not None:
            self.structured_output_manager.clear_backend()


def _engine_core_outputs(results: list[tuple[Request, list[int]]],
                         runner_out: SampledModelRunnerOutput) -> list[EngineCoreOutput]:
    """Attach each request's logprobs rows to its new tokens (the part of vLLM's
    Scheduler.update_from_output that builds EngineCoreOutputs)."""
    index = {req_id: i for i, req_id in enumerate(runner_out.req_ids)}
    outputs = []
    for req, new_ids in results:
        i = index.get(req.request_id)
        new_logprobs = None
        if runner_out.logprobs is not None and i is not None and new_ids \
                and req.sampling_params.logprobs is not None:
            new_logprobs = runner_out.logprobs.slice_request(i, len(new_ids))
        outputs.append(EngineCoreOutput(req, new_ids, new_logprobs,
                                        runner_out.prompt_logprobs_dict.get(req.request_id)))
    return outputs


def _structured_output_manager(config: EngineConfig, tokenizer: Tokenizer,
                               vocab_size: int) -> StructuredOutputManager:
    reasoner_cls = None
    if config.reasoning_parser:
        from engine.reasoning import ReasoningParserManager

        reasoner_cls = ReasoningParserManager.get_reasoning_parser(config.reasoning_parser)
        reasoner_cls(tokenizer)  # fails now if the vocab lacks its markers, not per request
    so_config = StructuredOutputsConfig(backend=config.structured_outputs_backend,
                                        reasoning_parser=config.reasoning_parser)
    return StructuredOutputManager(tokenizer, vocab_size, so_config, reasoner_cls)


def _or_neg(v: int | None) -> int:
    return -1 if v is None else v
