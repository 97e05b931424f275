"""ModelRunner: turns a SchedulerOutput into one forward pass and sampled tokens.

Mirrors vllm/v1/worker/gpu_model_runner.py in shape: it keeps its own per-request
state (CachedRequestState), updated from the scheduler's diff each step, builds the
flat input batch and attention metadata, runs the model, computes prompt logprobs for
the requests that ask (over the scheduled chunk; chunks of a chunked prefill are
concatenated and handed over with the first sampled token, as vLLM's
_get_prompt_logprobs_dict), and samples the requests whose scheduled tokens reach the
end of their known sequence. Everything stays on the logits' device until the host
copies at the end of the step. The persistent device-side input batch and CUDA
graphs arrive with the GPU issue.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.core.sched_output import GrammarOutput, ModelRunnerOutput, SchedulerOutput
from engine.layers.attention import Attention, AttentionMetadata
from engine.sample.metadata import SamplingMetadata, build_sampling_metadata
from engine.sample.ops.logprobs import compute_logprobs, gather_logprobs
from engine.sample.ops.torch_utils import async_tensor_h2d
from engine.sample.outputs import LogprobsLists, LogprobsTensors
from engine.sample.sampler import Sampler
from engine.sampling_params import SamplingParams, SamplingType
from engine.structured_output.utils import apply_grammar_bitmask

_PROMPT_LOGITS_ROWS = 512  # prompt positions per logits matmul (bounds [rows, vocab] memory)


@dataclass
class CachedRequestState:
    req_id: str
    token_ids: list[int]  # prompt + generated, as the runner knows them
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    generator: torch.Generator | None
    num_prompt_tokens: int = 0
    # prompt logprobs still to produce (vocab size for -1); None: not asked or delivered
    num_prompt_logprobs: int | None = None
    in_progress_prompt_logprobs: list[LogprobsTensors] = field(default_factory=list)


@dataclass
class SampledModelRunnerOutput(ModelRunnerOutput):
    """ModelRunnerOutput plus vLLM's logprobs fields (vllm/v1/outputs.py)."""

    logprobs: LogprobsLists | None = None  # sampled-token rows; cu: first row per request
    prompt_logprobs_dict: dict[str, LogprobsLists] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor],
                 device: torch.device, block_size: int) -> None:
        self.model = model
        self.device = device
        self.block_size = block_size
        self.sampler = Sampler()
        self.requests: dict[str, CachedRequestState] = {}
        attn_layers = [m for m in model.modules() if isinstance(m, Attention)]
        for layer, cache in zip(attn_layers, kv_caches, strict=True):
            layer.kv_cache = cache  # vLLM's bind_kv_cache

    def _update_states(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids:
            state = self.requests.pop(req_id, None)
            if state is not None and req_id in so.preempted_req_ids:
                self.requests[req_id] = state  # keep its generator across recompute
                state.block_ids = []
        vocab = self.model.config.vocab_size
        for new in so.scheduled_new_reqs:
            old = self.requests.get(new.req_id)
            sp = new.sampling_params
            state = CachedRequestState(
                new.req_id, list(new.token_ids), sp, list(new.block_ids),
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
            state.block_ids.extend(new_blocks)
            state.num_computed_tokens = num_computed

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput,
                      grammar_output: GrammarOutput | None = None) -> SampledModelRunnerOutput:
        self._update_states(so)
        req_ids = list(so.num_scheduled_tokens)
        if not req_ids:
            return SampledModelRunnerOutput([], [])
        input_ids, positions, slots, qsl, seq_lens = [], [], [], [0], []
        for req_id in req_ids:
            st = self.requests[req_id]
            n = so.num_scheduled_tokens[req_id]
            start = st.num_computed_tokens
            input_ids.extend(st.token_ids[start:start + n])
            pos = range(start, start + n)
            positions.extend(pos)
            slots.extend(st.block_ids[p // self.block_size] * self.block_size
                         + p % self.block_size for p in pos)
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
        max_blocks = max(len(self.requests[r].block_ids) for r in req_ids)
        block_table = torch.zeros(len(req_ids), max_blocks, dtype=torch.int32)
        for i, r in enumerate(req_ids):
            ids = self.requests[r].block_ids
            block_table[i, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        md = AttentionMetadata(len(input_ids), _t(slots, self.device), qsl, seq_lens,
                               block_table.to(self.device))
        hidden = self.model(_t(input_ids, self.device), _t(positions, self.device), md)
        prompt_logprobs = self._get_prompt_logprobs_dict(hidden, req_ids, qsl)

        # sample only requests whose scheduled tokens reach the end of what is known
        rows = [i for i, r in enumerate(req_ids)
                if seq_lens[i] == len(self.requests[r].token_ids)]
        sampled_per_req: list[list[int]] = [[] for _ in req_ids]
        logprobs = None
        if rows:
            last = async_tensor_h2d([qsl[i + 1] - 1 for i in rows], torch.long, self.device)
            logits = self.model.compute_logits(hidden[last])
            if grammar_output is not None:
                _apply_grammar(logits, grammar_output, [req_ids[i] for i in rows])
            states = [self.requests[req_ids[i]] for i in rows]
            out = self.sampler(logits, self._sampling_metadata(states))
            if out.logprobs_tensors is not None:
                logprobs = out.logprobs_tensors.tolists(_first_rows(rows, len(req_ids)))
            for i, st, tok in zip(rows, states, out.sampled_token_ids.tolist()):
                st.token_ids.append(tok)
                sampled_per_req[i] = [tok]
        for i, r in enumerate(req_ids):
            self.requests[r].num_computed_tokens = seq_lens[i]
        return SampledModelRunnerOutput(
            req_ids, sampled_per_req, logprobs,
            {r: t.tolists() for r, t in prompt_logprobs.items()})

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

    def _sampling_metadata(self, states: list[CachedRequestState]) -> SamplingMetadata:
        return build_sampling_metadata(
            [s.sampling_params for s in states], [s.token_ids for s in states],
            [s.num_prompt_tokens for s in states],
            {i: s.generator for i, s in enumerate(states) if s.generator},
            self.model.config.vocab_size, self.device)


def _apply_grammar(logits: torch.Tensor, grammar_output: GrammarOutput,
                   sampled_req_ids: list[str]) -> None:
    """Mask the logits rows [num_sampled, vocab] of the structured requests in place;
    bitmask rows of requests not sampled this step are skipped."""
    row_of = {req_id: i for i, req_id in enumerate(sampled_req_ids)}
    picked = [(j, row_of[r]) for j, r in enumerate(grammar_output.structured_output_request_ids)
              if r in row_of]
    if not picked:
        return
    bitmask = grammar_output.grammar_bitmask
    if len(picked) != bitmask.shape[0]:
        bitmask = bitmask[[j for j, _ in picked]]
    apply_grammar_bitmask(logits, bitmask, [row for _, row in picked])


def _t(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


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
