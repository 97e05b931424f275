"""ctypes binding of the part of include/vllm.h the HTTP server uses.

Engine create/free/start_loop/metrics, the OpenAI layer (vllm_openai_request_len and the
vllm_openai_stream_* functions) and version/error strings. Structs mirror the header
field by field; struct_size versioning lets an older layout keep working with a newer
library. Every call that can block releases the GIL (ctypes.CDLL does).
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

VLLM_OK, VLLM_ERR_TIMEOUT, VLLM_END_OF_STREAM = 0, 10, 11
VLLM_ERR_ENGINE_DEAD = 14  # since 1.3
VLLM_OPENAI_DEFER_RESPONSE = 1
DEFAULT_LIB = Path(__file__).resolve().parents[2] / "build" / "libvllm.so"

_c_int32, _c_int64, _c_char_p, _c_void_p = (ctypes.c_int32, ctypes.c_int64, ctypes.c_char_p,
                                            ctypes.c_void_p)
_PROGRESS_CB = ctypes.CFUNCTYPE(_c_int32, ctypes.c_float, _c_void_p)


class EngineParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32), ("max_model_len", _c_int32), ("device", _c_char_p),
        ("dtype", _c_char_p), ("max_num_seqs", _c_int32), ("max_num_batched_tokens", _c_int32),
        ("block_size", _c_int32), ("enable_prefix_caching", _c_int32),
        ("kv_cache_memory_bytes", _c_int64), ("seed", _c_int64),
        ("enable_chunked_prefill", _c_int32), ("enforce_eager", _c_int32),
        ("served_model_name", _c_char_p), ("chat_template", _c_char_p),
        ("progress_callback", _PROGRESS_CB), ("progress_callback_user_data", _c_void_p),
        ("tokenizer", _c_char_p),  # since 0.2
        ("structured_outputs_backend", _c_char_p), ("reasoning_parser", _c_char_p),  # 0.3
        ("tool_call_parser", _c_char_p), ("enable_auto_tool_choice", _c_int32),
        ("load_format", _c_char_p), ("gpu_memory_utilization", ctypes.c_float),
        ("skip_tokenizer_init", _c_int32),
        ("async_scheduling", _c_int32),  # since 0.4
        ("n_threads", _c_int32),  # since 0.5
        ("multiprocessing", _c_int32),  # since 0.5
        ("tensor_parallel_size", _c_int32),  # since 1.0
        ("tool_strict_level", _c_char_p),  # since 1.1
        ("reasoning_start_str", _c_char_p), ("reasoning_end_str", _c_char_p),  # since 1.2
        ("quantization", _c_char_p), ("kv_cache_dtype", _c_char_p),  # since 1.3
        ("mamba_cache_dtype", _c_char_p), ("mamba_ssm_cache_dtype", _c_char_p),
        ("mamba_cache_mode", _c_char_p), ("calculate_kv_scales", _c_int32),
        ("runner", _c_char_p), ("convert", _c_char_p), ("pooler_config", _c_char_p),  # 1.3
    ]


METRIC_FIELDS = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "prefix_cache_queries", "prefix_cache_hits", "num_preemptions",
                 "prompt_tokens", "generation_tokens", "request_success_stop",
                 "request_success_length", "request_success_abort", "request_success_error",
                 "request_success_repetition")  # the last since 1.2


class Metrics(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("num_requests_running", _c_int32),
                ("num_requests_waiting", _c_int32), ("kv_cache_usage_perc", ctypes.c_double),
                *((name, _c_int64) for name in METRIC_FIELDS[3:])]


class VllmError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{message} (status {status})")
        self.status, self.message = status, message


def _signatures(lib: ctypes.CDLL) -> None:
    sig = {
        "vllm_version": (_c_char_p, []), "vllm_init": (_c_int32, []),
        "vllm_shutdown": (None, []),
        "vllm_last_error_copy": (ctypes.c_size_t, [_c_char_p, ctypes.c_size_t]),
        "vllm_engine_params_init": (None, [ctypes.POINTER(EngineParams), ctypes.c_size_t]),
        "vllm_engine_create": (_c_int32, [_c_char_p, ctypes.POINTER(EngineParams),
                                          ctypes.POINTER(_c_void_p)]),
        "vllm_engine_free": (None, [_c_void_p]),
        "vllm_engine_start_loop": (_c_int32, [_c_void_p]),
        "vllm_engine_metrics": (_c_int32, [_c_void_p, ctypes.POINTER(Metrics)]),
        "vllm_engine_check_health": (_c_int32, [_c_void_p]),  # since 1.3
        "vllm_engine_reset_prefix_cache": (_c_int32, [_c_void_p]),  # since 1.3
        "vllm_openai_request": (_c_int32, [
            _c_void_p, _c_char_p, _c_char_p, _c_char_p, ctypes.POINTER(_c_int32),
            ctypes.POINTER(_c_void_p), ctypes.POINTER(_c_void_p)]),
        "vllm_openai_request_len": (_c_int32, [
            _c_void_p, _c_char_p, _c_char_p, _c_char_p, ctypes.c_size_t, ctypes.c_uint32,
            ctypes.POINTER(_c_int32), ctypes.POINTER(_c_void_p), ctypes.POINTER(_c_void_p)]),
        "vllm_openai_stream_next": (_c_int32, [_c_void_p, _c_int32, ctypes.POINTER(_c_void_p)]),
        "vllm_openai_stream_cancel": (_c_int32, [_c_void_p]),
        "vllm_openai_stream_free": (None, [_c_void_p]),
        "vllm_string_free": (None, [_c_void_p]),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


class LibVLLM:
    """The loaded library; `engine` is the one engine this server owns."""

    def __init__(self, path: str | None = None) -> None:
        self.lib = ctypes.CDLL(str(path or os.environ.get("VLLM_LIB") or DEFAULT_LIB))
        _signatures(self.lib)
        self.engine: int | None = None
        self._free_lock = threading.Lock()

    def version(self) -> str:
        return self.lib.vllm_version().decode()

    def _check(self, status: int) -> None:
        if status != VLLM_OK:
            size = self.lib.vllm_last_error_copy(None, 0) + 1
            buf = ctypes.create_string_buffer(size)
            self.lib.vllm_last_error_copy(buf, size)
            raise VllmError(status, buf.value.decode("utf-8", "replace"))

    def _take_string(self, ptr: int | None) -> str:
        try:
            return ctypes.string_at(ptr).decode("utf-8")
        finally:
            self.lib.vllm_string_free(ptr)

    def create_engine(self, model: str, progress=None, **fields) -> None:
        """Loads the model (fields: EngineParams names; None keeps the default; progress:
        called with each load fraction) and starts the engine's background loop."""
        self._check(self.lib.vllm_init())
        params = EngineParams()
        self.lib.vllm_engine_params_init(ctypes.byref(params), ctypes.sizeof(params))
        if progress is not None:  # alive until vllm_engine_create returns
            params.progress_callback = _PROGRESS_CB(lambda fraction, _: progress(fraction) or 1)
        for name, value in fields.items():
            if value is not None:
                setattr(params, name, value.encode() if isinstance(value, str) else
                        value if isinstance(value, float) else int(value))
        engine = _c_void_p()
        self._check(self.lib.vllm_engine_create(model.encode(), ctypes.byref(params),
                                                ctypes.byref(engine)))
        self.engine = engine.value
        self._check(self.lib.vllm_engine_start_loop(self.engine))

    def free_engine(self) -> None:
        """Frees the engine (its live requests end as aborted); idempotent."""
        with self._free_lock:
            if self.engine is not None:
                self.lib.vllm_engine_free(self.engine)
                self.engine = None

    def shutdown(self) -> None:
        self.free_engine()
        self.lib.vllm_shutdown()

    def metrics(self) -> dict:
        out = Metrics(struct_size=ctypes.sizeof(Metrics))
        self._check(self.lib.vllm_engine_metrics(self.engine, ctypes.byref(out)))
        return {name: getattr(out, name) for name in METRIC_FIELDS}

    def check_health(self) -> None:
        """vllm_engine_check_health (since 1.3): raises VllmError (status
        VLLM_ERR_ENGINE_DEAD with the reason) once the engine died; never waits for a step."""
        self._check(self.lib.vllm_engine_check_health(self.engine))

    def reset_prefix_cache(self) -> None:
        """vllm_engine_reset_prefix_cache (since 1.3): VllmError (VLLM_ERR_INVALID_STATE)
        while running requests hold KV blocks."""
        self._check(self.lib.vllm_engine_reset_prefix_cache(self.engine))

    def openai_request(self, method: str, path: str, body: bytes | bytearray | None,
                       defer: bool = False) -> tuple[int, str | None, int | None]:
        """(HTTP status, response JSON or None, stream handle or None). The body goes with
        its length (vllm_openai_request_len: a NUL byte is part of it). defer: a
        non-streamed response comes as a stream handle too (status 0), so it can be
        cancelled; its one chunk is the body."""
        status, response, stream = _c_int32(), _c_void_p(), _c_void_p()
        body = body or b""
        data = (ctypes.c_char * len(body)).from_buffer(body) if isinstance(body, bytearray) \
            else body  # a bytearray is passed in place (32 MB: no copy holding the GIL)
        self._check(self.lib.vllm_openai_request_len(
            self.engine, method.encode(), path.encode(), data, len(body),
            VLLM_OPENAI_DEFER_RESPONSE if defer else 0, ctypes.byref(status),
            ctypes.byref(response), ctypes.byref(stream)))
        text = self._take_string(response.value) if response.value else None
        return status.value, text, stream.value

    def stream_next(self, stream: int, timeout_ms: int) -> str | None:
        """The next chunk; None on timeout; raises EOFError at the end of the response."""
        chunk = _c_void_p()
        status = self.lib.vllm_openai_stream_next(stream, timeout_ms, ctypes.byref(chunk))
        if status == VLLM_ERR_TIMEOUT:
            return None
        if status == VLLM_END_OF_STREAM:
            raise EOFError
        self._check(status)
        return self._take_string(chunk.value)

    def stream_cancel(self, stream: int) -> None:
        self.lib.vllm_openai_stream_cancel(stream)

    def stream_free(self, stream: int) -> None:
        self.lib.vllm_openai_stream_free(stream)
