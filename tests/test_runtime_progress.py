"""Load progress per tensor with abort (engine/load_progress.py): vllm_engine_create's
progress callback sees 0, then one value per GGUF tensor read in (0, 1), then 1; a 0
returned at the first value strictly between 0 and 1 ends the load with
VLLM_ERR_CANCELLED before the next tensor is read (far fewer than half of them, counted
with engine/gguf/reader.py on the same file). Both with the engine core in process and
in a child process (engine/engine_core/load_progress_relay.py: there the first tensor,
then one value per 1% of the load, then the last tensor). track() over several
checkpoint files (safetensors) reports each file as an equal part.

Oracle: llama.h's progress_callback contract (llama_model_loader calls it per tensor;
false aborts the load), the tensor count of the GGUF reader. Ours (vLLM's loaders report
a tqdm bar only).
"""

from __future__ import annotations

import pytest

from libvllm.engine.gguf.reader import GGUFReader
from libvllm.engine.load_progress import TENSORS_END, LoadCancelledError, reporting, track
from tests.test_capi_stream import open_library

api = pytest.fixture(scope="module")(open_library)


def _n_tensors(model_path: str) -> int:
    reader = GGUFReader(model_path)
    try:
        return len(reader.tensors)
    finally:
        reader.close()


# vllm_engine_params.multiprocessing: -1 the core in this process, 1 in a child
MODES = pytest.mark.parametrize("multiprocessing", [-1, 1], ids=["inproc", "child"])


def _create(api, model_path, on_progress, multiprocessing: int) -> int:
    ffi, lib = api.ffi, api.lib
    p, _keep = api.params(progress_callback=on_progress, multiprocessing=multiprocessing)
    out = ffi.new("vllm_engine **")
    status = lib.vllm_engine_create(model_path.encode(), p, out)
    if status == lib.VLLM_OK:
        lib.vllm_engine_free(out[0])
    return status


@pytest.mark.capi
@pytest.mark.slow
@MODES
def test_progress_is_reported_per_tensor(api, model_path, multiprocessing):
    seen = []

    @api.ffi.callback("int32_t(float, void *)")
    def on_progress(fraction, user_data):
        seen.append(fraction)
        return 1

    assert _create(api, model_path, on_progress, multiprocessing) == api.lib.VLLM_OK
    n = _n_tensors(model_path)
    assert seen[0] == 0.0 and seen[-1] == 1.0
    middle = seen[1:-1]
    assert middle[0] == pytest.approx(TENSORS_END / n)
    if multiprocessing == 1:  # the child's relay: one per 1%, the first and the last
        assert len(middle) <= 100 + 2 < n
    else:
        assert len(middle) == n
    assert all(0 < a < b < 1 for a, b in zip(middle, middle[1:]))
    assert middle[-1] == pytest.approx(TENSORS_END)


@pytest.mark.capi
@pytest.mark.slow
@MODES
def test_abort_at_the_first_partial_progress_reads_few_tensors(api, model_path,
                                                               multiprocessing):
    seen = []

    @api.ffi.callback("int32_t(float, void *)")
    def on_progress(fraction, user_data):
        seen.append(fraction)
        return 0 if 0 < fraction < 1 else 1

    assert _create(api, model_path, on_progress, multiprocessing) == \
        api.lib.VLLM_ERR_CANCELLED
    n = _n_tensors(model_path)
    assert len(seen) == 2 and seen[0] == 0.0  # no call after the abort
    read = round(seen[1] / TENSORS_END * n)
    assert read == 1 < n / 2
    assert f"({read} of {n} tensors read)" in api.error()


def test_track_reports_each_file_as_an_equal_part_and_stops_before_the_next_item():
    seen, consumed = [], []
    files = [["a", "b"], ["c", "d", "e", "f"]]
    with reporting(lambda p: seen.append(p) or len(seen) < 4):
        with pytest.raises(LoadCancelledError, match=r"\(2 of 4 tensors read\)"):
            for part, names in enumerate(files):
                for name in track(names, len(names), part, len(files)):
                    consumed.append(name)
    assert consumed == ["a", "b", "c", "d"]  # "e" is never read
    assert seen == pytest.approx([TENSORS_END * x for x in (0.25, 0.5, 0.625, 0.75)])
    assert list(track(["x"], 1)) == ["x"]  # no reporter outside reporting(): items only
