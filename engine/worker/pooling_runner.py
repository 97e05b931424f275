"""PoolingModelRunner: the pooling path of vllm/v1/worker/gpu_model_runner.py
(_pool: hidden states of the prompt, no logits, no sampling, one output per request).

A pooling request runs its prompt (in chunks when chunked prefill splits it); the hidden
states the pooler needs are kept per request (LAST: the last row of each chunk; CLS: the
prompt's first row; MEAN and token_embed: every row) until the prompt's last chunk ran, then pooled
(engine/layers/pooler.py), truncated to `dimensions` and normalized (use_activation).
The request then reports one placeholder token so the scheduler finishes it (its
SamplingParams carry max_tokens=1) and frees its KV blocks. The core fills
`pooling_params` (request id -> completed PoolingParams) as requests arrive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from libvllm.engine.core.sched_output import GrammarOutput, SchedulerOutput
from libvllm.engine.layers.pooler import embed_activation, pool_hidden_states
from libvllm.engine.pooler_config import PoolerConfig
from libvllm.engine.pooling_params import PoolingParams
from libvllm.engine.worker.model_runner import ModelRunner, SampledModelRunnerOutput

POOLED_TOKEN_ID = 0  # the placeholder token a finished pooling request reports


@dataclass
class PoolerModelRunnerOutput(SampledModelRunnerOutput):
    """SampledModelRunnerOutput plus vLLM's pooler_output (one per finished request)."""

    pooler_output: dict[str, list] = field(default_factory=dict)

    def get_output(self) -> PoolerModelRunnerOutput:  # already on the host
        return self


class PoolingModelRunner(ModelRunner):
    def __init__(self, *args, pooler: PoolerConfig, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pooler = pooler  # resolved (engine/pooler_config.py resolve_pooler_config)
        self.pooling_params: dict[str, PoolingParams] = {}
        self._hidden: dict[str, list[torch.Tensor]] = {}  # req -> [rows, hidden] chunks

    def _pooling_type(self, params: PoolingParams) -> str:
        return self.pooler.tok_pooling_type if params.task == "token_embed" \
            else self.pooler.seq_pooling_type

    @torch.inference_mode()
    def execute_model_async(self, so: SchedulerOutput,
                            grammar_output: GrammarOutput | None = None
                            ) -> PoolerModelRunnerOutput:
        for req_id in so.finished_req_ids:  # finished or preempted: recomputed from 0
            self._hidden.pop(req_id, None)
        self._update_states(so)
        if not so.num_scheduled_tokens:
            return PoolerModelRunnerOutput([], [])
        inp = self._prepare_inputs(so)
        qsl = inp.qsl.tolist()
        if inp.graph:
            hidden = self.cudagraphs.replay(inp.graph)[:qsl[-1]]  # [tokens, hidden]
        else:
            hidden = self.model(inp.input_ids, inp.positions, inp.md)  # [tokens, hidden]
        sampled: list[list[int]] = []
        pooled: dict[str, list] = {}
        for i, req_id in enumerate(inp.req_ids):
            st = self.requests[req_id]
            params = self.pooling_params[req_id]
            kind = self._pooling_type(params)
            lo, hi = qsl[i], qsl[i + 1]  # this chunk's rows
            if kind == "LAST":
                lo = hi - 1
            elif kind == "CLS":  # the prompt's first row only, in its first chunk
                hi = lo + 1 if st.num_computed_tokens == 0 else lo
            # a copy: a graph's output buffer is overwritten by the next step
            self._hidden.setdefault(req_id, []).append(hidden[lo:hi].clone())
            st.num_computed_tokens = int(inp.seq_lens[i])
            if st.num_computed_tokens < len(st.token_ids):  # more prompt chunks to come
                sampled.append([])
                continue
            rows = torch.cat(self._hidden.pop(req_id))  # [rows, hidden]
            vec = embed_activation(pool_hidden_states(rows, kind), params.dimensions,
                                   bool(params.use_activation))
            pooled[req_id] = vec.tolist()
            st.token_ids.append(POOLED_TOKEN_ID)
            sampled.append([POOLED_TOKEN_ID])
        return PoolerModelRunnerOutput(inp.req_ids, sampled, pooler_output=pooled)

