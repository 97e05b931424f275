"""ModelRunner: turns a SchedulerOutput into one forward pass and sampled tokens.

Mirrors vllm/v1/worker/gpu_model_runner.py in shape: it keeps its own per-request
state (CachedRequestState), updated from the scheduler's diff each step, builds the
flat input batch and attention metadata, runs the model, and samples the requests
whose scheduled tokens reach the end of their known sequence. The persistent
device-side input batch and CUDA graphs arrive with the GPU issue.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.sched_output import ModelRunnerOutput, SchedulerOutput
from engine.layers.attention import Attention, AttentionMetadata
from engine.sample.metadata import SamplingMetadata
from engine.sample.sampler import Sampler
from engine.sampling_params import SamplingParams


@dataclass
class CachedRequestState:
    req_id: str
    token_ids: list[int]  # prompt + generated, as the runner knows them
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    generator: torch.Generator | None
    num_prompt_tokens: int = 0


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
        for new in so.scheduled_new_reqs:
            old = self.requests.get(new.req_id)
            gen = old.generator if old else _make_generator(new.sampling_params, self.device)
            self.requests[new.req_id] = CachedRequestState(
                new.req_id, list(new.token_ids), new.sampling_params, list(new.block_ids),
                new.num_computed_tokens, gen,
                old.num_prompt_tokens if old else len(new.token_ids))
        c = so.scheduled_cached_reqs
        for req_id, new_blocks, num_computed in zip(c.req_ids, c.new_block_ids,
                                                    c.num_computed_tokens):
            state = self.requests[req_id]
            state.block_ids.extend(new_blocks)
            state.num_computed_tokens = num_computed

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(so)
        req_ids = list(so.num_scheduled_tokens)
        if not req_ids:
            return ModelRunnerOutput([], [])
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

        # sample only requests whose scheduled tokens reach the end of what is known
        rows = [i for i, r in enumerate(req_ids)
                if seq_lens[i] == len(self.requests[r].token_ids)]
        sampled_per_req: list[list[int]] = [[] for _ in req_ids]
        if rows:
            logits = self.model.compute_logits(hidden[[qsl[i + 1] - 1 for i in rows]])
            states = [self.requests[req_ids[i]] for i in rows]
            sampled = self.sampler(logits, self._sampling_metadata(states)).tolist()
            for i, st, tok in zip(rows, states, sampled):
                st.token_ids.append(tok)
                sampled_per_req[i] = [tok]
        for i, r in enumerate(req_ids):
            self.requests[r].num_computed_tokens = seq_lens[i]
        return ModelRunnerOutput(req_ids, sampled_per_req)

    def _sampling_metadata(self, states: list[CachedRequestState]) -> SamplingMetadata:
        sps = [s.sampling_params for s in states]
        greedy = [sp.sampling_type_greedy for sp in sps]
        dev = self.device
        vocab = self.model.config.vocab_size
        blocked = {}
        for i, (st, sp) in enumerate(zip(states, sps)):
            if len(st.token_ids) - st.num_prompt_tokens < sp.min_tokens:
                blocked[i] = {t for t in sp.all_stop_token_ids if 0 <= t < vocab}
        any_top_p = any(sp.top_p < 1.0 for sp in sps)
        any_top_k = any(0 < sp.top_k < vocab for sp in sps)
        any_min_p = any(sp.min_p > 0.0 for sp in sps)
        return SamplingMetadata(
            temperature=None if all(greedy) else torch.tensor(
                [sp.temperature for sp in sps], dtype=torch.float32, device=dev),
            all_greedy=all(greedy),
            all_random=not any(greedy),
            top_p=torch.tensor([sp.top_p for sp in sps], device=dev) if any_top_p else None,
            top_k=torch.tensor([sp.top_k if 0 < sp.top_k < vocab else vocab for sp in sps],
                               device=dev) if any_top_k else None,
            min_p=torch.tensor([sp.min_p for sp in sps], device=dev) if any_min_p else None,
            generators={i: st.generator for i, st in enumerate(states) if st.generator},
            min_tokens_blocked={i: b for i, b in blocked.items() if b},
        )


def _t(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def _make_generator(sp: SamplingParams, device: torch.device) -> torch.Generator | None:
    if sp.seed is None or sp.sampling_type_greedy:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(sp.seed)
    return gen
