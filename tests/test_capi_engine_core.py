"""vllm.h 0.5 `multiprocessing`: the engine core in a child process, at the C boundary
(build/libvllm.so loaded into this process, as tests/test_capi_stream.py does).

Checks: vllm_engine_step and streaming give the in-process greedy text; a bad model file
fails vllm_engine_create with VLLM_ERR_MODEL_LOAD and the child's message; an invalid
value is VLLM_ERR_INVALID_ARGUMENT; SIGKILL of the child during 8 streams ends each with
a VLLM_FINISH_ERROR event, the next calls return VLLM_ERR_INVALID_STATE ("engine dead")
within 5 s, no zombie is left and vllm_engine_free still works. Mirrors vLLM 0.33
tests/v1/shutdown/test_forward_error.py and test_startup_error.py.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from test_capi_stream import PROMPT, open_library

pytestmark = [pytest.mark.capi, pytest.mark.slow]

api = pytest.fixture(scope="module")(open_library)


def _core_children() -> list[int]:
    """Engine-core processes whose parent is this process."""
    me = str(os.getpid()).encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"libvllm.engine.engine_core.engine_core_proc" in argv and \
                    argv[argv.index(b"--parent-pid") + 1] == me:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _zombie_or_alive(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/stat").read_text()
        return True
    except FileNotFoundError:
        return False


def test_step_and_stream_match_in_process(api, model_path):
    local = api.create(model_path)
    want = api.step_text(local, "local", api.greedy(8))
    api.lib.vllm_engine_free(local)
    engine = api.create(model_path, multiprocessing=1)
    assert len(_core_children()) == 1
    assert api.step_text(engine, "step", api.greedy(8)) == want
    api.ok(api.lib.vllm_engine_start_loop(engine))
    events = api.pull_all(api.submit(engine, "stream", api.greedy(8)))
    assert "".join(e["text"] for e in events) == want
    api.lib.vllm_engine_free(engine)
    assert not _core_children()


def test_bad_values_and_bad_model(api, model_path, tmp_path):
    lib, ffi = api.lib, api.ffi
    out = ffi.new("vllm_engine **")
    p, _keep = api.params(multiprocessing=2)
    api.ok(lib.vllm_engine_create(model_path.encode(), p, out), lib.VLLM_ERR_INVALID_ARGUMENT)
    assert "multiprocessing must be -1, 0 or 1" in api.error()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\0" * 64)
    messages = []
    for mode in (-1, 1):
        p, _keep = api.params(multiprocessing=mode)
        api.ok(lib.vllm_engine_create(str(bad).encode(), p, out), lib.VLLM_ERR_MODEL_LOAD)
        messages.append(api.error())
    assert messages[0] == messages[1] and messages[0]
    assert not _core_children()


def test_sigkill_of_the_core_during_8_streams(api, model_path):
    lib, ffi = api.lib, api.ffi
    engine = api.create(model_path, multiprocessing=1)
    api.ok(lib.vllm_engine_start_loop(engine))
    (core,) = _core_children()
    requests = [api.submit(engine, f"s{i}", api.greedy(200)) for i in range(8)]
    event = ffi.new("const vllm_event **")
    api.ok(lib.vllm_request_next(requests[0], 60000, event))  # generation is under way
    os.kill(core, signal.SIGKILL)
    killed = time.monotonic()
    for request in requests:
        events = api.pull_all(request)
        last = events[-1]
        assert last["finished"] and last["finish_reason"] == lib.VLLM_FINISH_ERROR
        assert last["status"] == lib.VLLM_ERR_INTERNAL and last["error"].startswith(
            "engine dead: the engine core process died (killed by signal SIGKILL)")
        lib.vllm_request_free(request)
    out = ffi.new("vllm_request **")
    api.ok(lib.vllm_request_submit(engine, b"later", PROMPT.encode(), ffi.NULL, 0, ffi.NULL,
                                   ffi.NULL, ffi.NULL, out), lib.VLLM_ERR_INVALID_STATE)
    assert api.error().startswith("engine dead")
    metrics = ffi.new("vllm_metrics *")
    metrics.struct_size = ffi.sizeof("vllm_metrics")
    api.ok(lib.vllm_engine_metrics(engine, metrics), lib.VLLM_ERR_INVALID_STATE)
    assert time.monotonic() - killed < 5
    assert not _zombie_or_alive(core)  # reaped
    lib.vllm_engine_free(engine)
