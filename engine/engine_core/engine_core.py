"""EngineCore: the scheduler + KV cache + grammar manager + model runner, as
vllm/v1/engine/core.py (EngineCore: add_request, abort_requests, step,
step_with_batch_queue, utility methods).

The same object runs in the caller's process (InprocClient) or in the engine-core child
(EngineCoreProc). It takes EngineCoreRequests whose SamplingParams the front end already
completed and validated, and returns EngineCoreOutputs: new token ids, logprobs rows,
finish status, the step's SchedulerStats. Detokenization, stop strings and the user's
RequestOutputs belong to the front end (engine/llm_engine.py).
Async scheduling is vLLM's step_with_batch_queue: a queue of two steps, so step N+1 is
scheduled and queued on the device before the output of step N is waited for.
Start-up: load the model (load_format auto | dummy), profile the activation peak on CUDA
and size the KV cache from gpu_memory_utilization (kv_cache_memory_bytes overrides),
allocate and bind the cache, capture the decode CUDA graphs (not with enforce_eager).
With tensor_parallel_size > 1 this process is rank 0 of a MultiprocExecutor
(engine/executor/multiproc_executor.py): the workers mirror each start-up step and run
every step whose scheduler output it broadcasts; or, with distributed_executor_backend
external_launcher, one of the ranks a launcher started (engine/executor/
external_launcher.py). The KV cache holds this rank's kv heads.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import torch

from libvllm.engine import envs
from libvllm.engine.config import EngineConfig
from libvllm.engine.core.async_scheduler import AsyncScheduler
from libvllm.engine.core.kv_cache_interface import HybridKVCacheConfig
from libvllm.engine.core.kv_cache_manager import KVCacheManager
from libvllm.engine.core.kv_cache_utils import get_num_kv_blocks
from libvllm.engine.core.mamba_align import MambaAlignCache
from libvllm.engine.core.sched_output import SchedulerOutput
from libvllm.engine.core.scheduler import Scheduler
from libvllm.engine.distributed.parallel_state import device_backend
from libvllm.engine.engine_core.engine_core_messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
)
from libvllm.engine.errors import InvalidArgumentError, VllmError
from libvllm.engine.executor.external_launcher import ExternalLauncherExecutor
from libvllm.engine.executor.kv_heads import (
    kv_cache_shape,
    num_kv_heads_per_rank,
    verify_tensor_parallel,
)
from libvllm.engine.executor.multiproc_executor import MultiprocExecutor
from libvllm.engine.layers.kv_cache_dtype import kv_cache_torch_dtype
from libvllm.engine.layers.kv_scales import configure_kv_cache
from libvllm.engine.models.config import ModelArchConfig, get_diff_sampling_param
from libvllm.engine.request import Request, RequestStatus
from libvllm.engine.resolved_config import DeviceFacts, ResolvedConfig, resolve_config
from libvllm.engine.structured_output import (
    StructuredOutputManager,
    StructuredOutputRequest,
    StructuredOutputsConfig,
)
from libvllm.engine.tokenizer import Tokenizer
from libvllm.engine.worker.gpu_worker import determine_available_memory
from libvllm.engine.worker.mamba_utils import (
    allocate_hybrid_kv_cache,
    hybrid_kv_cache_config,
    num_attention_layers,
    num_gdn_layers,
)
from libvllm.engine.worker.model_load import load_model_and_tokenizer, resolve_device
from libvllm.engine.worker.model_runner import (
    AsyncModelRunnerOutput,
    ModelRunner,
    SampledModelRunnerOutput,
)
from libvllm.engine.worker.pooling_runner import PoolingModelRunner
from libvllm.engine.worker.torch_threads import set_torch_threads_for_runtime

_CPU_KV_CACHE_GIB = 4  # vLLM's VLLM_CPU_KVCACHE_SPACE default


def _hybrid_config(config: EngineConfig, arch: ModelArchConfig, dtype: torch.dtype,
                   mamba_cache_mode: str, max_model_len: int) -> HybridKVCacheConfig:
    """A hybrid GDN model's unified specs (vLLM's HybridAttentionMambaModelConfig /
    MambaModelConfig.verify_and_update_config): the attention block size of config
    raised so its page holds a state page."""
    return hybrid_kv_cache_config(
        arch, dtype, config.block_size, mamba_cache_dtype=config.mamba_cache_dtype,
        mamba_ssm_cache_dtype=config.mamba_ssm_cache_dtype,
        mamba_cache_mode=mamba_cache_mode, max_model_len=max_model_len,
        kv_dtype=kv_cache_torch_dtype(config.kv_cache_dtype, dtype))


def _device_facts(device: torch.device) -> DeviceFacts:
    if device.type != "cuda":
        return DeviceFacts(device.type)
    props = torch.cuda.get_device_properties(device)
    return DeviceFacts(device.type, props.name, props.total_memory)


def _resolve(config: EngineConfig, arch: ModelArchConfig, device: torch.device,
             dtype: torch.dtype) -> tuple[ResolvedConfig, HybridKVCacheConfig | None]:
    """The engine's one resolve step (engine/resolved_config.py) and, for a hybrid GDN
    model, the specs of its resolved block size and mamba_cache_mode."""
    hybrid = bool(num_gdn_layers(arch))
    resolved = resolve_config(
        config, arch.max_position_embeddings, _device_facts(device),
        (lambda mode, max_len: _hybrid_config(config, arch, dtype, mode, max_len)
         .attn_spec.block_size) if hybrid else None)
    if not hybrid:
        return resolved, None
    return resolved, _hybrid_config(config, arch, dtype, resolved.cache.mamba_cache_mode,
                                    resolved.scheduler.max_model_len)


class EngineCore:
    def __init__(self, config: EngineConfig, resolved: ResolvedConfig,
                 model: torch.nn.Module, arch: ModelArchConfig, tokenizer: Tokenizer | None,
                 device: torch.device, dtype: torch.dtype,
                 hybrid: HybridKVCacheConfig | None = None,
                 executor: MultiprocExecutor | ExternalLauncherExecutor | None = None
                 ) -> None:
        self.config = config  # the user's intent
        self.resolved = resolved  # what runs: everything below reads only this
        sched, cache = resolved.scheduler, resolved.cache
        self.executor = executor  # tensor parallel: the workers of ranks 1..tp-1
        self.tp_size = resolved.tensor_parallel_size
        verify_tensor_parallel(arch, self.tp_size)
        self.device = device
        self.eos_token_id = None if tokenizer is None else tokenizer.eos_token_id
        self.max_model_len = sched.max_model_len
        self.hybrid = hybrid
        self.pooling = resolved.runner_type == "pooling"  # engine/worker/pooling_runner.py
        runner_cls, runner_kw = (PoolingModelRunner, {"pooler": config.resolved_pooler()}) \
            if self.pooling else (ModelRunner, {})
        self.model_runner = runner_cls(
            model, None, device, cache.block_size, max_num_reqs=sched.max_num_seqs,
            max_num_tokens=sched.max_num_batched_tokens, max_model_len=self.max_model_len,
            **runner_kw)
        if executor is not None:  # the workers build their runners (and profile on CUDA)
            executor.init_workers(resolved,
                                  device.type == "cuda" and not cache.kv_cache_memory_bytes)
        self.num_gpu_blocks = self._num_kv_blocks(arch, dtype)
        if executor is not None:
            executor.initialize_kv_cache(self.num_gpu_blocks)
        kv_dtype = configure_kv_cache(model, cache.kv_cache_dtype, cache.calculate_kv_scales,
                                      dtype)  # engine/layers/kv_scales.py
        if self.hybrid is not None:  # one pool for KV and GDN state (vLLM's layout)
            self.hybrid = replace(self.hybrid, num_blocks=self.num_gpu_blocks)
            self.model_runner.initialize_kv_cache(
                allocate_hybrid_kv_cache(self.hybrid, device), self.hybrid)
        else:
            shape = kv_cache_shape(arch, self.num_gpu_blocks, cache.block_size, self.tp_size)
            self.model_runner.initialize_kv_cache(  # zeroed as vLLM's: resident from the start
                [torch.zeros(shape, dtype=kv_dtype, device=device)
                 for _ in range(arch.num_hidden_layers)])
        num_mamba_groups = 0 if self.hybrid is None else len(self.hybrid.mamba_groups)
        kv = KVCacheManager(self.num_gpu_blocks, cache.block_size, self.max_model_len,
                            cache.enable_prefix_caching, watermark=cache.watermark,
                            num_mamba_groups=num_mamba_groups)
        self.structured_output_manager = None if tokenizer is None else \
            _structured_output_manager(config, tokenizer, arch.vocab_size)
        scheduler_cls = AsyncScheduler if sched.async_scheduling else Scheduler
        self.scheduler = scheduler_cls(sched, kv,
                                       structured_output_manager=self.structured_output_manager)
        if num_mamba_groups and cache.mamba_cache_mode == "align":  # GDN prefix caching
            self.scheduler.mamba_align = MambaAlignCache(kv.block_pool, cache.block_size,
                                                         num_mamba_groups)
        # CUDA graphs, captured at start-up (vLLM's capture_model); 0.0 without
        self.cudagraph_capture_time_s = self.model_runner.capture_model(
            resolved.compilation.capture_sizes())
        if executor is not None:  # every rank samples the same draws (vLLM's set_random_seed)
            torch.manual_seed(resolved.seed)
        # steps queued on the device whose output is not processed yet, newest first
        self.batch_queue: deque[tuple[AsyncModelRunnerOutput, SchedulerOutput]] = deque()
        self.batch_queue_size = 2 if sched.async_scheduling else 1
        self.ready = EngineCoreReady(
            architecture=arch.architecture, name=arch.name, vocab_size=arch.vocab_size,
            num_gpu_blocks=self.num_gpu_blocks, config=resolved,
            cudagraph_capture_time_s=self.cudagraph_capture_time_s,
            default_sampling_params=get_diff_sampling_param(arch.generation_config),
            memory_profile=dict(self.model_runner.memory_profile),
            dtype=str(dtype).removeprefix("torch."),
            eos_token_ids=_eos_token_ids(arch.generation_config),
            hidden_size=arch.hidden_size, is_matryoshka=arch.is_matryoshka,
            matryoshka_dimensions=list(arch.matryoshka_dimensions or ()) or None,
            n_params=arch.checkpoint_numel, n_layers=arch.checkpoint_layers,
            gguf_metadata=arch.checkpoint_metadata)

    @classmethod
    def from_config(cls, config: EngineConfig) -> tuple[EngineCore, Tokenizer | None]:
        """The core and the tokenizer it loaded (the in-process front end shares it)."""
        if config.n_threads:  # vllm.h n_threads: process-wide (the core's process)
            torch.set_num_threads(config.n_threads)
        executor = None
        if config.tensor_parallel_size > 1:  # join the group before the shard loads
            executor_cls = ExternalLauncherExecutor \
                if config.distributed_executor_backend == "external_launcher" \
                else MultiprocExecutor
            executor = executor_cls(config, device_backend(resolve_device(config)))
        try:
            model, arch, tokenizer, device, dtype = load_model_and_tokenizer(config)
            if device.type == "cuda":  # vLLM's gpu_worker, once the weights are in
                set_torch_threads_for_runtime(config.n_threads)
            resolved, hybrid = _resolve(config, arch, device, dtype)
            return cls(config, resolved, model, arch, tokenizer, device, dtype, hybrid,
                       executor), tokenizer
        except BaseException:
            if executor is not None:
                executor.abort()
            raise

    def _num_kv_blocks(self, arch: ModelArchConfig, dtype: torch.dtype) -> int:
        cache, sched = self.resolved.cache, self.resolved.scheduler
        bs = cache.block_size
        kv_heads = num_kv_heads_per_rank(arch, self.tp_size)
        block_bytes = (2 * num_attention_layers(arch) * bs * kv_heads * arch.head_dim
                       * torch.finfo(kv_cache_torch_dtype(cache.kv_cache_dtype,
                                                          dtype)).bits // 8)
        state_blocks = 0  # hybrid: a block is a page of each buffer, a request holds states
        if self.hybrid is not None:
            block_bytes, state_blocks = self.hybrid.block_bytes, len(self.hybrid.mamba_groups)
        budget = cache.kv_cache_memory_bytes
        if not budget:
            if self.device.type == "cuda":  # vLLM's profile run + gpu_memory_utilization
                budget = determine_available_memory(
                    self.model_runner, sched.max_num_batched_tokens,
                    cache.gpu_memory_utilization, self.resolved.compilation.capture_sizes())
            else:  # the CPU default, capped at what max_num_seqs full contexts need
                need = sched.max_num_seqs * (
                    -(-self.max_model_len // bs) + 1 + state_blocks) * block_bytes
                budget = min((envs.VLLM_CPU_KVCACHE_SPACE or _CPU_KV_CACHE_GIB) << 30, need)
        return get_num_kv_blocks(budget, block_bytes, bs, self.max_model_len, state_blocks)

    # ---------------------------------------------------------------- requests

    def add_request(self, request: EngineCoreRequest) -> EngineCoreOutput | None:
        """Queue a request; a request the core refuses (it can never fit the KV cache)
        comes back as its last output with finish reason "error"."""
        sp = request.sampling_params
        rid = request.request_id
        so_request = None if sp.structured_outputs is None else StructuredOutputRequest(
            sp.structured_outputs, rid, set(sp.all_stop_token_ids), request.prompt_token_ids,
            request.reasoning_parser_kwargs)
        req = Request(rid, request.prompt_token_ids, sp, self.eos_token_id,
                      request.arrival_time, self.resolved.cache.block_size,
                      priority=request.priority,
                      cache_salt=request.cache_salt, structured_output_request=so_request)
        try:
            if rid in self.scheduler.requests:
                raise InvalidArgumentError(f"request id {rid!r} is already in use")
            if self.pooling != (request.pooling_params is not None):
                raise InvalidArgumentError("a pooling engine runs only pooling requests, a "
                                           "generate engine only generation requests")
            self.scheduler.add_request(req)
            if self.pooling:
                self.model_runner.pooling_params[rid] = request.pooling_params
        except VllmError as e:
            return EngineCoreOutput(rid, [], finish_reason="error", error=(e.status, str(e)))
        if so_request is not None:  # compiles on the manager's threads
            self.structured_output_manager.grammar_init(so_request)
        return None

    def abort_requests(self, request_ids: list[str]) -> None:
        """Finish requests the front end ended (abort, stop string): nothing comes back."""
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        if self.pooling:
            for rid in request_ids:
                self.model_runner.pooling_params.pop(rid, None)

    def has_work(self) -> bool:
        return bool(self.batch_queue) or self.scheduler.has_unfinished_requests()

    def step(self) -> EngineCoreOutputs:
        """Schedule and queue a step; unless the batch queue still has room (async
        scheduling), wait for the oldest step queued and return its outputs."""
        outputs: list[EngineCoreOutput] = []
        queue = self.batch_queue
        if self.scheduler.has_unfinished_requests():
            sched_out = self.scheduler.schedule()
            if sched_out.pending_output_tokens and queue:  # its sampling needs that output
                outputs += self._process_step(*queue.pop())
            grammar_output = self.scheduler.get_grammar_bitmask(sched_out)
            if self.executor is not None:
                self.executor.broadcast_step(sched_out, grammar_output)
            queue.appendleft((self.model_runner.execute_model_async(sched_out, grammar_output),
                              sched_out))
            if len(queue) < self.batch_queue_size and sched_out.total_num_scheduled_tokens:
                return self._with_stats(outputs)
        if queue:
            outputs += self._process_step(*queue.pop())
        return self._with_stats(outputs)

    def _process_step(self, future: AsyncModelRunnerOutput, sched_out: SchedulerOutput
                      ) -> list[EngineCoreOutput]:
        """Wait for a queued step's output: scheduler update, this step's outputs."""
        runner_out = future.get_output()
        results = self.scheduler.update_from_output(sched_out, runner_out)
        results += [(req, []) for req in self.scheduler.take_errored_requests()]
        outputs = _engine_core_outputs(results, runner_out)
        if self.pooling:
            pooled = runner_out.pooler_output
            for out in outputs:
                out.pooling_output = pooled.get(out.request_id)
                if out.finished:
                    self.model_runner.pooling_params.pop(out.request_id, None)
        return outputs

    def _with_stats(self, outputs: list[EngineCoreOutput]) -> EngineCoreOutputs:
        return EngineCoreOutputs(outputs, self.scheduler.make_stats(),
                                 self.scheduler.num_preemptions)

    # ---------------------------------------------------------------- utilities

    def make_stats(self) -> EngineCoreOutputs:
        """The scheduler's gauges now (an abort may have happened since the step)."""
        return self._with_stats([])

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM EngineCore.reset_prefix_cache: False while running requests hold blocks."""
        return self.scheduler.reset_prefix_cache(reset_running_requests)

    def peak_memory_bytes(self) -> int:
        """The core's peak torch-allocator bytes on its device (KV cache and graph pool
        included; 0 on CPU): the benchmarks' peak-memory row, from the core's process."""
        return torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" \
            else 0

    def shutdown(self) -> None:
        self.scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)
        while self.batch_queue:  # wait for the device; the outputs are of aborted requests
            self.batch_queue.pop()[0].get_output()
        if self.structured_output_manager is not None:
            self.structured_output_manager.clear_backend()
        if self.executor is not None:
            self.executor.shutdown()


def _engine_core_outputs(results: list[tuple[Request, list[int]]],
                         runner_out: SampledModelRunnerOutput) -> list[EngineCoreOutput]:
    """Each request's new tokens, logprobs rows and finish status (the part of vLLM's
    Scheduler.update_from_output that builds EngineCoreOutputs)."""
    index = {req_id: i for i, req_id in enumerate(runner_out.req_ids)}
    outputs = []
    for req, new_ids in results:
        i = index.get(req.request_id)
        new_logprobs = None
        if runner_out.logprobs is not None and i is not None and new_ids \
                and req.sampling_params.num_logprobs is not None:
            new_logprobs = runner_out.logprobs.slice_request(i, len(new_ids))
        error = None if req.error is None else (req.error.status, str(req.error))
        outputs.append(EngineCoreOutput(
            req.request_id, new_ids, new_logprobs,
            runner_out.prompt_logprobs_dict.get(req.request_id), req.get_finished_reason(),
            req.stop_reason, req.num_cached_tokens, error))
    return outputs


def _eos_token_ids(generation_config: dict) -> list[int]:
    """generation_config.json's eos_token_id (an int or a list; validated by the loader) or
    a GGUF's end-of-generation ids, as a list."""
    eos = generation_config.get("eos_token_id")
    return [eos] if isinstance(eos, int) else list(eos or [])


def _structured_output_manager(config: EngineConfig, tokenizer: Tokenizer,
                               vocab_size: int) -> StructuredOutputManager:
    reasoner_cls = None
    if config.reasoning_parser:
        from libvllm.engine.reasoning import ReasoningParserManager

        reasoner_cls = ReasoningParserManager.get_reasoning_parser(config.reasoning_parser)
        reasoner_cls(tokenizer)  # fails now if the vocab lacks its markers, not per request
    so_config = StructuredOutputsConfig(backend=config.structured_outputs_backend,
                                        reasoning_parser=config.reasoning_parser)
    return StructuredOutputManager(tokenizer, vocab_size, so_config, reasoner_cls)
