"""ModelRunner: turns a SchedulerOutput into one forward pass and sampled tokens, on CPU or CUDA.

Mirrors vllm/v1/worker/gpu_model_runner.py in shape: it keeps its own per-request
state (CachedRequestState), updated from the scheduler's diff each step, and a persistent
input batch (engine/worker/input_batch.py: preallocated input ids, positions, slot
mapping, query start locations, sequence lengths and a [max_num_reqs, max_blocks] block
table, filled on the host with numpy and copied to the device once each per step); it
builds the attention metadata once per step, runs the model (a captured CUDA graph of the
padded token count when the dispatcher has one, engine/worker/cudagraph_dispatcher.py,
cudagraph.py and cudagraph_runner.py: mixed prefill/decode steps too, a hybrid's as
breakable graphs whose GDN core runs eagerly on the step's rows), applies the grammar bitmask of
structured-output requests, samples on the device, and computes prompt logprobs for the
requests that ask (over the scheduled chunk; chunks of a chunked prefill are concatenated
and handed over with the first sampled token, as vLLM's _get_prompt_logprobs_dict). The
only host sync of a step is AsyncModelRunnerOutput.get_output, which waits for the copy
of the sampled token ids (plus logprobs when asked). execute_model_async returns before
it (async scheduling, vLLM's AsyncGPUModelRunnerOutput): the next step can be prepared
while this one runs; a token still in flight is a -1 placeholder in the request's token
ids, and the next step's input takes it from the device tensor of sampled ids (vLLM's
_prepare_input_ids). A hybrid GDN model's KV and state share one block pool
(engine/worker/mamba_utils.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from libvllm.engine.core.sched_output import GrammarOutput, ModelRunnerOutput, SchedulerOutput
from libvllm.engine.errors import InvalidArgumentError
from libvllm.engine.layers.attention import Attention, AttentionMetadata, num_leading_decodes
from libvllm.engine.sample.metadata import (
    SamplingMetadata,
    build_sampling_metadata,
    reads_output_token_ids,
)
from libvllm.engine.sample.ops.logprobs import compute_logprobs, gather_logprobs
from libvllm.engine.sample.ops.thinking_budget import ThinkingScan
from libvllm.engine.sample.ops.topk_topp_sampler import warm_up_sampling_kernels
from libvllm.engine.sample.ops.torch_utils import async_tensor_h2d
from libvllm.engine.sample.outputs import LogprobsLists, LogprobsTensors
from libvllm.engine.sample.sampler import Sampler
from libvllm.engine.sampling_params import SamplingParams, SamplingType
from libvllm.engine.structured_output.utils import apply_grammar_bitmask
from libvllm.engine.worker.cudagraph import CudaGraphs
from libvllm.engine.worker.cudagraph_dispatcher import BatchDescriptor
from libvllm.engine.worker.cudagraph_runner import PAD_SLOT_ID, CudaGraphRunnerMixin, _graph_rows
from libvllm.engine.worker.input_batch import BlockTable, CpuGpuBuffer
from libvllm.engine.worker.mamba_utils import HybridKVCacheConfig, MambaStateCache, profile_gdn_core

_PROMPT_LOGITS_ROWS = 512  # prompt positions per logits matmul (bounds [rows, vocab] memory)
PLACEHOLDER_TOKEN_ID = -1  # a sampled token still in flight (async scheduling)


@dataclass
class CachedRequestState:
    req_id: str
    token_ids: list[int]  # prompt + generated, as the runner knows them
    sampling_params: SamplingParams
    row: int  # its row in the block table; -1 while preempted (no blocks)
    num_computed_tokens: int
    generator: torch.Generator | None
    num_prompt_tokens: int = 0
    # prompt logprobs still to produce (vocab size for -1); None: not asked or delivered
    num_prompt_logprobs: int | None = None
    in_progress_prompt_logprobs: list[LogprobsTensors] = field(default_factory=list)
    # positions in token_ids of sampled tokens still in flight (placeholders), oldest first
    pending_positions: list[int] = field(default_factory=list)
    thinking_scan: ThinkingScan = field(default_factory=ThinkingScan)  # thinking budget


@dataclass
class SampledModelRunnerOutput(ModelRunnerOutput):
    """ModelRunnerOutput plus vLLM's logprobs fields (vllm/v1/outputs.py)."""

    logprobs: LogprobsLists | None = None  # sampled-token rows; cu: first row per request
    prompt_logprobs_dict: dict[str, LogprobsLists] = field(default_factory=dict)


@dataclass
class _StepInputs:
    req_ids: list[str]
    qsl: np.ndarray  # [num_reqs + 1] int32 (host)
    seq_lens: np.ndarray  # [num_reqs] int32 (host)
    input_ids: torch.Tensor  # [num_padded_tokens] on the device
    positions: torch.Tensor  # [num_padded_tokens]
    md: AttentionMetadata
    graph: BatchDescriptor | None  # the captured graph that runs the step; None: eager


class AsyncModelRunnerOutput:
    """A step's output once its sampled ids reach the host (vLLM's
    AsyncGPUModelRunnerOutput): get_output waits for the copy, then writes the tokens
    over the placeholders of the requests' token ids."""

    def __init__(self, req_ids: list[str], sampled_rows: list[tuple[int, CachedRequestState]],
                 sampled: torch.Tensor | None, copied: torch.cuda.Event | None,
                 logprobs: LogprobsTensors | None, first_rows: list[int],
                 prompt_logprobs: dict[str, LogprobsTensors]) -> None:
        self.req_ids = req_ids
        self.sampled_rows = sampled_rows  # (request index, its state) per sampled row
        self.sampled = sampled  # [len(sampled_rows)] int64 on the host (pinned on CUDA)
        self.copied = copied  # recorded after the device -> host copy of `sampled`
        self.logprobs = logprobs
        self.first_rows = first_rows
        self.prompt_logprobs = prompt_logprobs
        self._output: SampledModelRunnerOutput | None = None

    def get_output(self) -> SampledModelRunnerOutput:
        if self._output is not None:
            return self._output
        if self.copied is not None:
            self.copied.synchronize()
        sampled_per_req: list[list[int]] = [[] for _ in self.req_ids]
        if self.sampled is not None:
            for (i, st), tok in zip(self.sampled_rows, self.sampled.tolist()):
                pos = st.pending_positions.pop(0)
                st.token_ids[pos] = tok
                sampled_per_req[i] = [tok]
        self._output = SampledModelRunnerOutput(
            self.req_ids, sampled_per_req,
            None if self.logprobs is None else self.logprobs.tolists(self.first_rows),
            {r: t.tolists() for r, t in self.prompt_logprobs.items()})
        return self._output


class ModelRunner(CudaGraphRunnerMixin):
    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor] | None,
                 device: torch.device, block_size: int, max_num_reqs: int = 256,
                 max_num_tokens: int = 8192, max_model_len: int | None = None) -> None:
        """kv_caches may come later (initialize_kv_cache, after profile_run); without
        max_model_len a request may hold every block of the cache."""
        self.model = model
        self.device = device
        self.block_size = block_size
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_tokens
        self.max_model_len = max_model_len
        self.sampler = Sampler()
        self.requests: dict[str, CachedRequestState] = {}
        self.cudagraphs: CudaGraphs | None = None
        self.memory_profile: dict[str, int] = {}  # bytes, from gpu_worker's profile run
        # the last step's host -> device copies out of the pinned buffers, while no host
        # sync has shown them done (a step that samples nothing ends without one)
        self._copies_in_flight: torch.cuda.Event | None = None
        # the last step's sampled ids on the device and each request's row in them: the
        # source of the next step's placeholder inputs (async scheduling)
        self._prev_sampled: torch.Tensor | None = None  # [num_sampled] int64
        self._prev_sampled_row: dict[str, int] = {}
        buf = {"device": device}
        self.input_ids = CpuGpuBuffer(max_num_tokens, dtype=torch.long, **buf)
        self.positions = CpuGpuBuffer(max_num_tokens, dtype=torch.long, **buf)
        self.slot_mapping = CpuGpuBuffer(max_num_tokens, dtype=torch.long, **buf)
        # one row more than requests: a graph's padding tokens form a request of their own
        self.query_start_loc = CpuGpuBuffer(max_num_reqs + 2, dtype=torch.int32, **buf)
        self.seq_lens = CpuGpuBuffer(max_num_reqs + 1, dtype=torch.int32, **buf)
        self.block_table: BlockTable | None = None
        self.mamba: MambaStateCache | None = None  # Gated DeltaNet state (hybrid models)
        self._capture_gdn: dict[int, list] = {}  # num_tokens -> breakable capture metadata
        if kv_caches is not None:
            self.initialize_kv_cache(kv_caches)

    def initialize_kv_cache(self, kv_caches: list[torch.Tensor],
                            hybrid: HybridKVCacheConfig | None = None) -> None:
        """Bind one [2, num_blocks, block_size, nkv, hd] cache per attention layer (vLLM's
        bind_kv_cache; hybrid: views of the pool's raw buffers) and size the block table."""
        attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        if hybrid is not None:
            self.mamba, kv_caches = MambaStateCache.bind(self.model, kv_caches, hybrid,
                                                         self.max_num_reqs, self.device)
        for layer, cache in zip(attn_layers, kv_caches, strict=True):
            layer.kv_cache = cache
        max_blocks = -(-self.max_model_len // self.block_size) if self.max_model_len \
            else kv_caches[0].shape[1]
        self.block_table = BlockTable(self.max_num_reqs, max_blocks, self.device, pad_rows=1)

    def _update_states(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids:
            if self.mamba is not None:
                self.mamba.free(req_id)
            state = self.requests.pop(req_id, None)
            if state is None:
                continue
            if state.row >= 0:
                self.block_table.free_row(state.row)
                state.row = -1
            if req_id in so.preempted_req_ids:
                self.requests[req_id] = state  # keep its generator across recompute
        vocab = self.model.config.vocab_size
        for new in so.scheduled_new_reqs:
            old = self.requests.get(new.req_id)
            if old is not None and old.row >= 0:
                self.block_table.free_row(old.row)
            sp = new.sampling_params
            if self.mamba is not None:
                self.mamba.add(new.req_id, new.state_block_ids, new.num_computed_tokens,
                               new.mamba_restore_block_ids)
            state = CachedRequestState(
                new.req_id, list(new.token_ids), sp, self.block_table.add_row(new.block_ids),
                new.num_computed_tokens,
                old.generator if old else _make_generator(sp, self.device),
                len(new.prompt_token_ids) or (old.num_prompt_tokens if old
                                              else len(new.token_ids)))
            if old is not None:  # resumed: prompt logprobs restart with the recompute
                state.num_prompt_logprobs = old.num_prompt_logprobs
            elif sp.prompt_logprobs is not None:
                state.num_prompt_logprobs = vocab if sp.prompt_logprobs == -1 \
                    else min(sp.prompt_logprobs, vocab)
            self.requests[new.req_id] = state
        c = so.scheduled_cached_reqs
        for req_id, new_blocks, num_computed in zip(c.req_ids, c.new_block_ids,
                                                    c.num_computed_tokens):
            state = self.requests[req_id]
            self.block_table.append(state.row, new_blocks)
            state.num_computed_tokens = num_computed

    def _prepare_inputs(self, so: SchedulerOutput) -> _StepInputs:
        """Fill the persistent buffers for this step (host numpy), one copy each to the
        device; a step that a captured graph covers is padded to its size."""
        if self._copies_in_flight is not None:  # the pinned buffers may still be read
            self._copies_in_flight.synchronize()
            self._copies_in_flight = None
        req_ids = list(so.num_scheduled_tokens)
        states = [self.requests[r] for r in req_ids]
        n = len(req_ids)
        num_sched = np.fromiter((so.num_scheduled_tokens[r] for r in req_ids), np.int32, n)
        starts = np.fromiter((st.num_computed_tokens for st in states), np.int32, n)
        total = int(num_sched.sum())
        if n > self.max_num_reqs or total > self.max_num_tokens:
            raise InvalidArgumentError(f"a step of {n} requests / {total} tokens exceeds the "
                                       f"runner's {self.max_num_reqs} / {self.max_num_tokens}")
        max_query_len = int(num_sched.max())
        graph = self.cudagraphs.dispatcher.dispatch(total, max_query_len == 1) \
            if self.cudagraphs else None
        padded = graph.num_tokens if graph else total
        qsl = self.query_start_loc.np
        qsl[0] = 0
        np.cumsum(num_sched, out=qsl[1:n + 1])
        seq_lens = self.seq_lens.np
        seq_lens[:n] = starts + num_sched
        tokens: list[int] = []
        dst, src = [], []  # input positions of tokens in flight, their rows in _prev_sampled
        for req_id, st, s, k in zip(req_ids, states, starts.tolist(), num_sched.tolist()):
            tokens.extend(st.token_ids[s:s + k])
            if st.pending_positions and st.pending_positions[-1] < s + k:
                dst.append(len(tokens) - 1)
                src.append(self._prev_sampled_row[req_id])
        self.input_ids.np[:total] = tokens
        req_of = np.repeat(np.arange(n), num_sched)  # [total] request index of each token
        pos = starts[req_of] + (np.arange(total, dtype=np.int32) - qsl[req_of])
        self.positions.np[:total] = pos
        block_table = self.block_table.commit(np.fromiter((st.row for st in states), np.int64, n))
        blocks = self.block_table.step.np[req_of, pos // self.block_size].astype(np.int64)
        self.slot_mapping.np[:total] = blocks * self.block_size + pos % self.block_size
        rows = n
        if graph:  # padding: no context, no KV write
            rows = _graph_rows(graph)
            seq_lens[n:rows] = 0
            self.slot_mapping.np[total:padded] = PAD_SLOT_ID
            self.input_ids.np[total:padded] = 0
            self.positions.np[total:padded] = 0
            if graph.uniform:  # one padding token per padding request
                qsl[n + 1:rows + 1] = np.arange(total + 1, padded + 1)
            else:  # the padding tokens are request n's, later rows have none
                qsl[n + 1:rows + 1] = padded
            block_table = self.block_table.step.gpu[:rows]
        md = AttentionMetadata(
            total, self.slot_mapping.copy_to_gpu(padded), qsl[:n + 1].tolist(),
            seq_lens[:n].tolist(), block_table, self.query_start_loc.copy_to_gpu(rows + 1),
            self.seq_lens.copy_to_gpu(rows), max_query_len,
            0 if graph else int(seq_lens[:n].max()),
            num_decodes=0 if graph else num_leading_decodes(num_sched))
        if self.mamba is not None and graph and self._breakable(graph):
            # the eager GDN core of a breakable graph runs on the step's own rows
            md.gdn = self.mamba.build_metadata(req_ids, starts.tolist(), qsl[:n + 1].tolist(),
                                               max_query_len, md.query_start_loc_t[:n + 1])
        elif self.mamba is not None:
            md.gdn = self.mamba.build_metadata(req_ids, starts.tolist(), qsl[:n + 1].tolist(),
                                               max_query_len, md.query_start_loc_t, rows)
        inputs = _StepInputs(req_ids, qsl[:n + 1].copy(), seq_lens[:n].copy(),
                             self.input_ids.copy_to_gpu(padded),
                             self.positions.copy_to_gpu(padded), md, graph)
        if dst:  # tokens sampled by the step in flight, straight from the device
            index = async_tensor_h2d([dst, src], torch.long, self.device)
            inputs.input_ids[index[0]] = self._prev_sampled[index[1]]
        if self.device.type == "cuda":
            self._copies_in_flight = torch.cuda.Event()
            self._copies_in_flight.record()
        return inputs

    def execute_model(self, so: SchedulerOutput, grammar_output: GrammarOutput | None = None
                      ) -> SampledModelRunnerOutput:
        return self.execute_model_async(so, grammar_output).get_output()

    @torch.inference_mode()
    def execute_model_async(self, so: SchedulerOutput,
                            grammar_output: GrammarOutput | None = None
                            ) -> AsyncModelRunnerOutput:
        """Queue the step on the device; its output comes from get_output()."""
        self._update_states(so)
        if not so.num_scheduled_tokens:
            return AsyncModelRunnerOutput([], [], None, None, None, [], {})
        inp = self._prepare_inputs(so)
        req_ids, qsl, seq_lens = inp.req_ids, inp.qsl, inp.seq_lens
        if inp.graph and self._breakable(inp.graph):  # its eager GDN core reads the step
            self.mamba.step_ref.metadata = inp.md.gdn
            hidden = self.cudagraphs.replay(inp.graph)[:int(qsl[-1])]
            self.mamba.step_ref.metadata = None
        elif inp.graph:
            hidden = self.cudagraphs.replay(inp.graph)[:int(qsl[-1])]
        else:
            hidden = self.model(inp.input_ids, inp.positions, inp.md)
        if self.mamba is not None and so.mamba_saves:  # prefix caching: keep GDN states
            self.mamba.save(so.mamba_saves)
        prompt_logprobs = self._get_prompt_logprobs_dict(hidden, req_ids, qsl.tolist())

        # sample only requests whose scheduled tokens reach the end of what is known
        rows = [i for i, r in enumerate(req_ids)
                if seq_lens[i] == len(self.requests[r].token_ids)]
        states = [self.requests[req_ids[i]] for i in rows]
        sampled = copied = logprobs = None
        if rows:
            if len(rows) == hidden.shape[0]:  # every token is a request's last one (decode)
                logits = self.model.compute_logits(hidden)
                last_ids = inp.input_ids[:len(rows)]  # [len(rows)]: S[-1], maybe in flight
            else:
                last = async_tensor_h2d([int(qsl[i + 1]) - 1 for i in rows], torch.long,
                                        self.device)
                logits = self.model.compute_logits(hidden[last])
                last_ids = inp.input_ids[last]
            if grammar_output is not None:
                self._apply_grammar_bitmask(logits, grammar_output, [req_ids[i] for i in rows])
            out = self.sampler(logits, self._sampling_metadata(states, last_ids))
            logprobs = out.logprobs_tensors
            self._prev_sampled = out.sampled_token_ids  # [len(rows)] int64
            self._prev_sampled_row = {req_ids[i]: j for j, i in enumerate(rows)}
            sampled, copied = self._copy_to_host(out.sampled_token_ids)
            for st in states:
                st.pending_positions.append(len(st.token_ids))
                st.token_ids.append(PLACEHOLDER_TOKEN_ID)
        for i, r in enumerate(req_ids):
            self.requests[r].num_computed_tokens = int(seq_lens[i])
        return AsyncModelRunnerOutput(req_ids, list(zip(rows, states)), sampled, copied,
                                      logprobs, _first_rows(rows, len(req_ids)),
                                      prompt_logprobs)

    def _copy_to_host(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """A queued device -> pinned host copy and the event after it (CPU: t itself)."""
        if self.device.type != "cuda":
            return t, None
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event

    @staticmethod
    def _apply_grammar_bitmask(logits: torch.Tensor, grammar: GrammarOutput,
                               sampled_req_ids: list[str]) -> None:
        """Mask the logits rows of the listed requests that are sampled this step."""
        row_of = {r: j for j, r in enumerate(sampled_req_ids)}
        keep = [k for k, r in enumerate(grammar.structured_output_request_ids) if r in row_of]
        if not keep:
            return
        bitmask = grammar.grammar_bitmask
        if len(keep) != bitmask.shape[0]:
            bitmask = bitmask[keep]
        rows = [row_of[grammar.structured_output_request_ids[k]] for k in keep]
        apply_grammar_bitmask(logits, bitmask, rows)

    @torch.inference_mode()
    def profile_run(self, num_tokens: int, sample: bool = True) -> torch.Tensor:
        """vLLM's profile_run: a forward pass over num_tokens tokens without KV cache
        (attention skipped; a hybrid's GDN cores run, on a scratch state:
        engine/worker/mamba_utils.py profile_gdn_core) plus, with `sample`, logits and a
        sort of max_num_reqs rows (the sampler's top-k/top-p peak), so the activation
        peak can be measured; on CUDA the sampler's argmax kernels compile here too."""
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        with profile_gdn_core(self.model, num_tokens, self.max_num_reqs, self.device):
            hidden = self.model(ids, ids, None)
        if sample:
            logits = self.model.compute_logits(hidden[:min(num_tokens, self.max_num_reqs)])
            logits.sort(dim=-1)
            warm_up_sampling_kernels(logits)
        return hidden

    def _get_prompt_logprobs_dict(self, hidden: torch.Tensor, req_ids: list[str],
                                  qsl: list[int]) -> dict[str, LogprobsTensors]:
        """Prompt logprobs of the scheduled chunk of each request that asks; a request's
        chunks are returned together once its prefill completes."""
        done: dict[str, LogprobsTensors] = {}
        for i, req_id in enumerate(req_ids):
            st = self.requests[req_id]
            k = st.num_prompt_logprobs
            if k is None:
                continue
            start_tok = st.num_computed_tokens + 1  # row j predicts prompt token j + 1
            num_remaining = st.num_prompt_tokens - start_tok
            num_tokens = qsl[i + 1] - qsl[i]
            num_logits = min(num_tokens, num_remaining)
            targets = async_tensor_h2d(st.token_ids[start_tok:start_tok + max(num_logits, 0)],
                                       torch.long, self.device)
            for lo in range(0, max(num_logits, 0), _PROMPT_LOGITS_ROWS):
                hi = min(lo + _PROMPT_LOGITS_ROWS, num_logits)
                logits = self.model.compute_logits(hidden[qsl[i] + lo:qsl[i] + hi])
                st.in_progress_prompt_logprobs.append(
                    gather_logprobs(compute_logprobs(logits), k, targets[lo:hi]))
            if num_tokens > num_remaining:  # the last prompt chunk
                parts, st.in_progress_prompt_logprobs = st.in_progress_prompt_logprobs, []
                done[req_id] = LogprobsTensors.cat(parts) if parts else _empty_logprobs(
                    k, self.device)
                st.num_prompt_logprobs = None
        return done

    def _sampling_metadata(self, states: list[CachedRequestState],
                           last_ids: torch.Tensor) -> SamplingMetadata:
        # bad words read the outputs on the host: the engine resolves placeholders first
        assert not (any(s.pending_positions for s in states)  # empty without async
                    and any(reads_output_token_ids(s.sampling_params) for s in states)), \
            "sampling needs a token still in flight"
        return build_sampling_metadata(
            [s.sampling_params for s in states], [s.token_ids for s in states],
            [s.num_prompt_tokens for s in states],
            {i: s.generator for i, s in enumerate(states) if s.generator},
            self.model.config.vocab_size, self.device, [s.thinking_scan for s in states],
            last_ids)


def _first_rows(rows: list[int], num_reqs: int) -> list[int]:
    """Request index -> its first row among the sampled rows (the sampled ones before it)."""
    sampled, first, count = set(rows), [], 0
    for i in range(num_reqs):
        first.append(count)
        count += i in sampled
    return first


def _empty_logprobs(k: int, device: torch.device) -> LogprobsTensors:
    return LogprobsTensors(torch.empty((0, k + 1), dtype=torch.long, device=device),
                           torch.empty((0, k + 1), device=device),
                           torch.empty(0, dtype=torch.long, device=device))


def _make_generator(sp: SamplingParams, device: torch.device) -> torch.Generator | None:
    if sp.sampling_type != SamplingType.RANDOM_SEED:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(sp.seed & 0xFFFF_FFFF_FFFF_FFFF)  # as torch maps negatives; n > 1 wraps
    return gen
