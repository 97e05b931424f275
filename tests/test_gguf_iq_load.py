"""A GGUF whose matrices are MXFP4 (one of the types engine/gguf/dequant.py hands to
gguf.quants) loads: every parameter equals the one loaded from an F32 twin holding the
dequantized values, so the loader's per-tensor paths (Llama's q/k un-permute, tied
embeddings) run on those types as on the ones with torch kernels
(.agents/specs/gguf-iq-dequant.md). gguf.quants can quantize MXFP4 (not the IQ types).
"""

from __future__ import annotations

import gguf
import pytest

from libvllm.engine.model_loader import load_gguf_model
from tests.test_models_parity import make_hf_model, write_gguf_twin

MXFP4 = gguf.GGMLQuantizationType.MXFP4


def _matrices_as_mxfp4(add_tensor, roundtrip_only: bool):
    """GGUFWriter.add_tensor storing matrices as MXFP4 blocks, or (roundtrip_only) as F32
    arrays of the values those blocks dequantize to."""
    def add(self, name, array, *args, **kw):
        if array.ndim == 2 and array.shape[1] % 32 == 0:
            raw = gguf.quants.quantize(array, MXFP4)
            if roundtrip_only:
                return add_tensor(self, name, gguf.quants.dequantize(raw, MXFP4), *args, **kw)
            return add_tensor(self, name, raw, raw_dtype=MXFP4)
        return add_tensor(self, name, array, *args, **kw)
    return add


def test_mxfp4_matrices_load_as_their_dequantized_values(tmp_path):
    hf = make_hf_model("llama")
    paths = {}
    for kind in ("mxfp4", "f32"):
        paths[kind] = tmp_path / f"{kind}.gguf"
        with pytest.MonkeyPatch.context() as m:
            m.setattr(gguf.GGUFWriter, "add_tensor", _matrices_as_mxfp4(
                gguf.GGUFWriter.add_tensor, roundtrip_only=kind == "f32"))
            write_gguf_twin(hf, "llama", paths[kind])
    reader = gguf.GGUFReader(paths["mxfp4"])
    assert sum(t.tensor_type == MXFP4 for t in reader.tensors) >= 7  # the layer matrices
    got, _, r1 = load_gguf_model(str(paths["mxfp4"]))
    want, _, r2 = load_gguf_model(str(paths["f32"]))
    r1.close()
    r2.close()
    want_params = dict(want.named_parameters())
    for name, param in got.named_parameters():
        assert param.equal(want_params.pop(name)), name
    assert not want_params
