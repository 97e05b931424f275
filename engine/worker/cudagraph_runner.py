"""The model runner's CUDA-graph side: capture at start-up and the forward a graph
captures, as vllm/v1/worker/gpu_model_runner.py (capture_model, _capture_cudagraphs,
_dummy_run over the persistent buffers). ModelRunner (engine/worker/model_runner.py)
inherits it; the graphs themselves are engine/worker/cudagraph.py, the dispatch
engine/worker/cudagraph_dispatcher.py.

Hybrid GDN models: their GDN backend graphs uniform decode batches only (vLLM's
GDNAttentionMetadataBuilder reports AttentionCGSupport.UNIFORM_BATCH), so, as vLLM's
FULL_AND_PIECEWISE does, decode steps replay full graphs (persistent state-index
buffers) and mixed prefill/decode steps piecewise ones: breakable graphs
(engine/breakable_cudagraph.py) whose GDN core runs eagerly on the step's own rows
(md.gdn holds the MambaStateCache's step reference, set before each replay). While such a
graph is captured (and in the compile pass before), its core runs on capture_lens rows
on the null block (engine/worker/mamba_utils.py), so the mixed steps' conv, chunked and
recurrent kernel variants compile at start-up. FULL becomes FULL_AND_PIECEWISE for them,
as vLLM resolves FULL with a UNIFORM_BATCH backend. Before any capture, a hybrid's eager
mixed steps at max_num_tokens compile their variants (_compile_eager_mixed_steps).
"""

from __future__ import annotations

import itertools

import torch

from libvllm.engine.compilation_config import CUDAGraphMode
from libvllm.engine.layers.attention import Attention, AttentionMetadata
from libvllm.engine.layers.gdn import dummy_gdn_metadata
from libvllm.engine.model_loader.gguf_quant import precompile_gguf_kernels
from libvllm.engine.worker.cudagraph import CudaGraphs
from libvllm.engine.worker.cudagraph_dispatcher import BatchDescriptor, CudagraphDispatcher
from libvllm.kernels._common import precompile_triton

PAD_SLOT_ID = -1  # slot of a padding token: the cache kernel skips it


class CudaGraphRunnerMixin:
    """capture_model / init_cudagraphs / the captured forward of ModelRunner (which owns
    the persistent buffers, block table, mamba state cache and model used here)."""

    def capture_model(self, sizes: list[int]) -> float:
        """Capture CUDA graphs for `sizes` (token counts; CUDA only) in the mode they carry
        (engine/compilation_config.py CaptureSizes, resolved by engine/resolved_config.py; a
        plain list: FULL); returns
        the capture time in s. On CUDA the GGUF layers' kernels compile first, graphs or
        not."""
        mode = getattr(sizes, "mode", CUDAGraphMode.FULL)
        if self.device.type != "cuda":
            return 0.0
        precompile_gguf_kernels(self.model)  # GGUF layers' Triton variants, side by side
        self._compile_eager_mixed_steps()
        if not sizes or mode == CUDAGraphMode.NONE:
            return 0.0
        graphs = self.init_cudagraphs(CudaGraphs, mode, sizes)
        self.memory_profile["cudagraph_pool"] = graphs.pool_bytes
        return graphs.capture_time_s

    @torch.inference_mode()
    def _compile_eager_mixed_steps(self) -> None:
        """A hybrid's eager mixed steps (past the largest graph, or without graphs), their
        Triton launches only compiling (kernels/_common.py precompile_triton), on the
        batches of eager_mixed_lens, on the null block with no KV write: the attention
        decode split, the unified prefill kernel over the prefill rows (one segment, or
        split with its reduce) and the GDN kernels of such steps compile here, not inside
        a timed run. Skipped while a layer still has KV scales to calculate (an eager
        step would mark them done)."""
        attn = [m for m in self.model.modules() if isinstance(m, Attention)]
        if self.mamba is None or any(a.calculate_kv_scales for a in attn):
            return
        dev, table = self.device, self.block_table.step.gpu  # [rows, max_blocks] int32
        with precompile_triton():
            for lens in eager_mixed_lens(self.max_num_tokens):
                m, d = sum(lens), lens.count(1)
                qsl = [0, *itertools.accumulate(lens)]
                md = AttentionMetadata(
                    m, torch.full((m,), PAD_SLOT_ID, dtype=torch.long, device=dev), qsl,
                    lens, table.new_zeros(len(lens), table.shape[1]),  # the null block
                    torch.tensor(qsl, dtype=torch.int32, device=dev),
                    torch.tensor(lens, dtype=torch.int32, device=dev), max(lens), max(lens),
                    num_decodes=d)
                md.gdn = [dummy_gdn_metadata(lens, dev)] * len(self.mamba.groups)
                ids = torch.zeros(m, dtype=torch.long, device=dev)
                self.model(ids, ids, md)

    def init_cudagraphs(self, graphs_cls: type[CudaGraphs], mode: CUDAGraphMode,
                        sizes: list[int]) -> CudaGraphs:
        """Dispatcher and graphs for `sizes`; the persistent buffers get their padding
        values here, once, outside any graph: a write inside the captured forward would be
        replayed at every step, over the step's own inputs."""
        dispatcher = CudagraphDispatcher(mode, [s for s in sizes if s <= self.max_num_tokens],
                                         self.max_num_reqs)
        descs = dispatcher.capture_descs()
        if descs:
            rows = max(_graph_rows(d) for d in descs)
            tokens = dispatcher.max_capture_size
            self.seq_lens.gpu[:rows].zero_()
            self.query_start_loc.gpu[:rows + 1].zero_()
            self.slot_mapping.gpu[:tokens].fill_(PAD_SLOT_ID)
            if self.mamba is not None:
                self.mamba.reset_graph_buffers()
            self.input_ids.gpu[:tokens].zero_()
            self.positions.gpu[:tokens].zero_()
        if self.mamba is not None:  # what the breakable graphs' cores run on at capture
            self._capture_gdn = {d.num_tokens: self.mamba.capture_metadata(d.num_tokens)
                                 for d in descs if self._breakable(d)}
        graphs = graphs_cls(dispatcher, self._breakable)
        graphs.capture(self._graph_forward)
        self._capture_gdn = {}
        if self.mamba is not None:
            self.mamba.step_ref.metadata = None
        self.cudagraphs = graphs
        return graphs

    def _breakable(self, desc: BatchDescriptor) -> bool:
        """Whether a graph is captured breakable: a hybrid's mixed steps (the GDN backend
        graphs uniform decode batches only, vLLM's AttentionCGSupport.UNIFORM_BATCH: its
        FULL_AND_PIECEWISE runs mixed steps piecewise, the GDN core eagerly)."""
        return self.mamba is not None and not desc.uniform

    def _graph_forward(self, desc: BatchDescriptor) -> torch.Tensor:
        """The forward a graph of `desc` captures: the model over the persistent buffers'
        first desc.num_tokens rows; it writes none of them."""
        n, rows = desc.num_tokens, _graph_rows(desc)
        md = AttentionMetadata(n, self.slot_mapping.gpu[:n], [], [],
                               self.block_table.step.gpu[:rows],
                               self.query_start_loc.gpu[:rows + 1], self.seq_lens.gpu[:rows],
                               1 if desc.uniform else n)
        if self._breakable(desc):  # the core reads the step's metadata when it runs
            if self._capture_gdn:  # capturing: the core runs on the capture batch
                self.mamba.step_ref.metadata = self._capture_gdn[n]
            md.gdn = [self.mamba.step_ref] * len(self.mamba.groups)
        elif self.mamba is not None:  # the device buffers each step's build_metadata fills
            md.gdn = self.mamba.graph_metadata(rows, md.query_start_loc_t)
        return self.model(self.input_ids.gpu[:n], self.positions.gpu[:n], md)


def eager_mixed_lens(max_tokens: int) -> list[list[int]]:
    """Row lengths of the eager mixed steps compiled at start-up: 1 or 4 decode rows
    (the slices after them 16-byte aligned or not) then one prefill row of the rest of
    max_tokens (the unified kernel in one segment), or 1, 2, 4 or 16 two-token prefill
    rows (split into segments, then reduced; a row count of 1, unaligned, aligned, a
    multiple of 16); the batches that fit max_tokens."""
    out = [[1] * d + [max_tokens - d] for d in (1, 4) if max_tokens - d >= 2]
    out += [[1] * d + [2] * r for d in (1, 4) for r in (1, 2, 4, 16)
            if d + 2 * r <= max_tokens]
    return out


def _graph_rows(desc: BatchDescriptor) -> int:
    """Request rows of a graph's attention metadata: a uniform decode graph has one per
    token; a mixed one its requests plus the padding tokens' request."""
    return desc.num_reqs if desc.uniform else desc.num_reqs + 1
