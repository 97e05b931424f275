"""What include/vllm.h's comments promise is what the library does:
a zeroed engine params struct with only struct_size set is valid, a model directory
holding one .gguf loads it (and two are refused), VLLM_END_OF_STREAM sets no error
message, and vllm_engine_num_unfinished counts a pulled request until its
last event was pulled. (The SIGINT and thread-safety comments: test_capi_host_runtime.py,
test_capi_threads.py.)

A Python host drives build/libvllm.so through cffi's ABI mode in a child process.
Oracle: the header's comments; vLLM's defaults (block_size 16).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.capi, pytest.mark.slow]

_HOST = r"""
import json, os, sys, time
import cffi
from libvllm.capi.header import api_cdef
ffi = cffi.FFI()
ffi.cdef(api_cdef())
lib = ffi.dlopen(sys.argv[1])
model, work = sys.argv[2], sys.argv[3]
seen = {}
err = lambda: ffi.string(lib.vllm_last_error()).decode()
engine = ffi.new("vllm_engine **")

# a zeroed engine struct, struct_size alone set
params = ffi.new("vllm_engine_params *")
params.struct_size = ffi.sizeof("vllm_engine_params")
seen["zeroed_engine"] = [lib.vllm_engine_create(model.encode(), params, engine), err()]
e = engine[0]
sampling = ffi.new("vllm_sampling_params *")
lib.vllm_sampling_params_init(sampling, ffi.sizeof(sampling[0]))
sampling.temperature = 0.0
seen["zeroed_engine_add"] = [lib.vllm_request_add(e, b"z", b"The capital of France is",
                                                    ffi.NULL, 0, sampling), err()]
text, tokens, left = "", 0, ffi.new("size_t *", 1)
outs, n = ffi.new("vllm_request_output **"), ffi.new("size_t *")
while left[0]:
    assert lib.vllm_engine_step(e, outs, n) == 0, err()
    for i in range(n[0]):
        text += ffi.string(outs[0][i].text).decode()
        tokens = outs[0][i].num_output_tokens
    lib.vllm_engine_num_unfinished(e, left)
seen["zeroed_engine_output"] = [text, tokens]

# pull mode: unfinished until the last event is pulled; END_OF_STREAM leaves no message
assert lib.vllm_engine_start_loop(e) == 0, err()
sp = ffi.new("vllm_sampling_params *")
lib.vllm_sampling_params_init(sp, ffi.sizeof(sp[0]))
sp.max_tokens = 2
request = ffi.new("vllm_request **")
assert lib.vllm_request_submit(e, b"p", b"Hello", ffi.NULL, 0, sp, ffi.NULL, ffi.NULL,
                               request) == 0, err()
metrics = ffi.new("vllm_metrics *")
metrics.struct_size = ffi.sizeof("vllm_metrics")
deadline = time.time() + 120
while time.time() < deadline:  # the loop finished it; nothing pulled yet
    lib.vllm_engine_metrics(e, metrics)
    if metrics.request_success_length:
        break
    time.sleep(0.05)
time.sleep(0.5)  # the loop has handed the last event to the request's queue
lib.vllm_engine_num_unfinished(e, left)
seen["unfinished_before_pull"] = left[0]
event = ffi.new("vllm_event **")
while lib.vllm_request_next(request[0], 5000, event) == 0 and not event[0].finished:
    pass
lib.vllm_engine_num_unfinished(e, left)
seen["unfinished_after_pull"] = left[0]
seen["end_of_stream"] = [lib.vllm_request_next(request[0], 0, event), err()]
lib.vllm_request_free(request[0])
lib.vllm_engine_free(e)

# a directory holding one .gguf loads it; two are refused
for name, copies in (("one", 1), ("two", 2)):
    folder = os.path.join(work, name)
    os.makedirs(folder)
    for i in range(copies):
        os.symlink(model, os.path.join(folder, f"model-{i}.gguf"))
    status = lib.vllm_engine_create(folder.encode(), ffi.NULL, engine)
    seen[f"directory_{name}"] = [status, err()]
    lib.vllm_engine_free(engine[0])
lib.vllm_shutdown()
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def seen(built, child_env, model_path, tmp_path_factory) -> dict:
    run = subprocess.run([sys.executable, "-c", _HOST, str(built / "libvllm.so"), model_path,
                          str(tmp_path_factory.mktemp("dirs"))], capture_output=True, text=True,
                         env={**child_env, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_zeroed_engine_params_take_the_defaults(seen):
    assert seen["zeroed_engine"] == [0, ""]


def test_an_engine_of_zeroed_params_generates(seen):
    assert seen["zeroed_engine_add"] == [0, ""]
    text, tokens = seen["zeroed_engine_output"]
    assert "Paris" in text and 1 <= tokens <= 16


def test_a_pulled_request_is_unfinished_until_its_last_event_is_pulled(seen):
    assert seen["unfinished_before_pull"] == 1
    assert seen["unfinished_after_pull"] == 0


def test_end_of_stream_sets_no_error_message(seen):
    assert seen["end_of_stream"] == [11, ""]  # VLLM_END_OF_STREAM


def test_a_directory_with_one_gguf_loads_it(seen):
    assert seen["directory_one"] == [0, ""]


def test_a_directory_with_two_ggufs_is_refused(seen):
    status, message = seen["directory_two"]
    assert status == 3 and "several .gguf files" in message  # VLLM_ERR_MODEL_LOAD
