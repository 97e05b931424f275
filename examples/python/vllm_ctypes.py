"""A ctypes binding of the parts of include/vllm.h that examples/python uses.

Engine (a loaded model with its background loop) and Request (an iterator of streamed
events) free their handles on close() / with-blocks. Works in any Python of the
version libvllm was built for, also one that imported torch first: the library then
runs its engine in this interpreter.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    byref,
    c_char_p,
    c_double,
    c_float,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_void_p,
    sizeof,
)

VLLM_OK = 0
VLLM_END_OF_STREAM = 11
FINISH_REASONS = ("none", "stop", "length", "abort", "error", "repetition")

PROGRESS_CALLBACK = CFUNCTYPE(c_int32, c_float, c_void_p)


class EngineParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_model_len", c_int32),
        ("device", c_char_p),
        ("dtype", c_char_p),
        ("max_num_seqs", c_int32),
        ("max_num_batched_tokens", c_int32),
        ("block_size", c_int32),
        ("enable_prefix_caching", c_int32),
        ("kv_cache_memory_bytes", c_int64),
        ("seed", c_int64),
        ("enable_chunked_prefill", c_int32),
        ("enforce_eager", c_int32),
        ("served_model_name", c_char_p),
        ("chat_template", c_char_p),
        ("progress_callback", PROGRESS_CALLBACK),
        ("progress_callback_user_data", c_void_p),
        ("tokenizer", c_char_p),
        ("structured_outputs_backend", c_char_p),
        ("reasoning_parser", c_char_p),
        ("tool_call_parser", c_char_p),
        ("enable_auto_tool_choice", c_int32),
        ("load_format", c_char_p),
        ("gpu_memory_utilization", c_float),
        ("skip_tokenizer_init", c_int32),
        ("async_scheduling", c_int32),  # since 0.4
        ("n_threads", c_int32),  # since 0.5
        ("multiprocessing", c_int32),  # since 0.5
        ("tensor_parallel_size", c_int32),  # since 1.0
        ("tool_strict_level", c_char_p),  # since 1.1
        ("reasoning_start_str", c_char_p),  # since 1.2
        ("reasoning_end_str", c_char_p),  # since 1.2
        ("quantization", c_char_p),  # since 1.3
        ("kv_cache_dtype", c_char_p),  # since 1.3
        ("mamba_cache_dtype", c_char_p),  # since 1.3
        ("mamba_ssm_cache_dtype", c_char_p),  # since 1.3
        ("mamba_cache_mode", c_char_p),  # since 1.3
        ("calculate_kv_scales", c_int32),  # since 1.3
        ("runner", c_char_p), ("convert", c_char_p), ("pooler_config", c_char_p),  # 1.3
    ]


class SamplingParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_tokens", c_int32),
        ("temperature", c_float),
        ("top_p", c_float),
        ("top_k", c_int32),
        ("min_p", c_float),
        ("seed", c_int64),
        ("has_seed", c_int32),
        ("ignore_eos", c_int32),
        ("stop_token_ids", POINTER(c_int32)),
        ("n_stop_token_ids", c_size_t),
        ("skip_special_tokens", c_int32),
        ("presence_penalty", c_float),
        ("frequency_penalty", c_float),
        ("repetition_penalty", c_float),
        ("min_tokens", c_int32),
        ("stop", POINTER(c_char_p)),
        ("n_stop", c_size_t),
        ("include_stop_str_in_output", c_int32),
        ("logit_bias_token_ids", POINTER(c_int32)),
        ("logit_bias_values", POINTER(c_float)),
        ("n_logit_bias", c_size_t),
        ("allowed_token_ids", POINTER(c_int32)),
        ("n_allowed_token_ids", c_size_t),
        ("bad_words", POINTER(c_char_p)),
        ("n_bad_words", c_size_t),
        ("json_schema", c_char_p),
        ("json_object", c_int32),
        ("regex", c_char_p),
        ("choice", POINTER(c_char_p)),
        ("n_choice", c_size_t),
        ("grammar", c_char_p),
        ("structural_tag", c_char_p),
        ("logprobs", c_int32),  # since 1.0
        ("n", c_int32),  # since 1.0
        ("repetition_max_pattern_size", c_int32),  # since 1.2
        ("repetition_min_pattern_size", c_int32),  # since 1.2
        ("repetition_min_count", c_int32),  # since 1.2
        ("thinking_token_budget", c_int32),  # since 1.2
        ("logprob_token_ids", POINTER(c_int32)),  # since 1.2
        ("n_logprob_token_ids", c_size_t),  # since 1.2
        ("use_generation_config", c_int32),  # since 1.3
    ]


class Event(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("finished", c_int32),
        ("request_id", c_char_p),
        ("token_ids", POINTER(c_int32)),
        ("n_token_ids", c_size_t),
        ("text", c_char_p),
        ("finish_reason", c_int32),
        ("num_prompt_tokens", c_int32),
        ("num_output_tokens", c_int32),
        ("num_cached_tokens", c_int32),
        ("status", c_int32),
        ("error", c_char_p),
        ("index", c_int32),  # since 1.0
        ("logprobs", c_void_p),  # const vllm_token_logprobs *
        ("arrival_time", c_double),
        ("first_token_latency", c_double),
        ("e2e_latency", c_double),
    ]


class Metrics(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_requests_running", c_int32),
        ("num_requests_waiting", c_int32),
        ("kv_cache_usage_perc", c_double),
        ("prefix_cache_queries", c_int64),
        ("prefix_cache_hits", c_int64),
        ("num_preemptions", c_int64),
        ("prompt_tokens", c_int64),
        ("generation_tokens", c_int64),
        ("request_success_stop", c_int64),
        ("request_success_length", c_int64),
        ("request_success_abort", c_int64),
        ("request_success_error", c_int64),
        ("request_success_repetition", c_int64),  # since 1.2
    ]


def _default_library() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("LIBVLLM") or os.path.join(here, "..", "..", "build", "libvllm.so")


def load(path: str | None = None) -> ctypes.CDLL:
    """The library with the signatures this module uses (CDLL: calls release the GIL)."""
    lib = ctypes.CDLL(path or _default_library())
    engine, request = c_void_p, c_void_p
    sigs = {
        "vllm_abi_version": (c_uint32, []),
        "vllm_status_string": (c_char_p, [c_int32]),
        "vllm_last_error": (c_char_p, []),
        "vllm_shutdown": (None, []),
        "vllm_engine_params_init": (None, [POINTER(EngineParams), c_size_t]),
        "vllm_engine_create": (c_int32, [c_char_p, POINTER(EngineParams), POINTER(engine)]),
        "vllm_engine_free": (None, [engine]),
        "vllm_engine_start_loop": (c_int32, [engine]),
        "vllm_engine_metrics": (c_int32, [engine, POINTER(Metrics)]),
        "vllm_engine_check_health": (c_int32, [engine]),  # since 1.3
        "vllm_engine_reset_prefix_cache": (c_int32, [engine]),  # since 1.3
        "vllm_sampling_params_init": (None, [POINTER(SamplingParams), c_size_t]),
        "vllm_request_submit": (c_int32, [engine, c_char_p, c_char_p, POINTER(c_int32),
                                          c_size_t, POINTER(SamplingParams), c_void_p,
                                          c_void_p, POINTER(request)]),
        "vllm_request_next": (c_int32, [request, c_int32, POINTER(POINTER(Event))]),
        "vllm_request_free": (None, [request]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


class VllmError(Exception):
    def __init__(self, lib: ctypes.CDLL, status: int, message: str | None = None) -> None:
        name = lib.vllm_status_string(status).decode()
        text = message if message is not None else lib.vllm_last_error().decode()
        super().__init__(f"{name}: {text}")
        self.status = status


class Engine:
    """A loaded model with its background loop running."""

    def __init__(self, lib: ctypes.CDLL, model_path: str, max_model_len: int = 1024) -> None:
        self.lib = lib
        params = EngineParams()
        lib.vllm_engine_params_init(byref(params), sizeof(params))
        params.max_model_len = max_model_len
        self.handle = c_void_p()
        self._check(lib.vllm_engine_create(model_path.encode(), byref(params),
                                           byref(self.handle)))
        self._check(lib.vllm_engine_start_loop(self.handle))

    def _check(self, status: int) -> None:
        if status != VLLM_OK:
            raise VllmError(self.lib, status)

    def generate(self, request_id: str, prompt: str, max_tokens: int = 32) -> Request:
        """A greedy request; iterate the result for its events."""
        sp = SamplingParams()
        self.lib.vllm_sampling_params_init(byref(sp), sizeof(sp))
        sp.temperature, sp.max_tokens = 0.0, max_tokens
        handle = c_void_p()
        self._check(self.lib.vllm_request_submit(self.handle, request_id.encode(),
                                                 prompt.encode(), None, 0, byref(sp), None,
                                                 None, byref(handle)))
        return Request(self, handle)

    def metrics(self) -> Metrics:
        m = Metrics(struct_size=ctypes.sizeof(Metrics))
        self._check(self.lib.vllm_engine_metrics(self.handle, byref(m)))
        return m

    def healthy(self) -> bool:
        """vllm_engine_check_health: False once the engine died (since 1.3)."""
        return self.lib.vllm_engine_check_health(self.handle) == VLLM_OK

    def reset_prefix_cache(self) -> None:
        """Forget the cached prefixes; raises while running requests hold KV blocks."""
        self._check(self.lib.vllm_engine_reset_prefix_cache(self.handle))

    def close(self) -> None:
        if self.handle:
            self.lib.vllm_engine_free(self.handle)
            self.handle = c_void_p()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Request:
    """Yields (text, token_ids, finish_reason or None) per event; closing cancels."""

    def __init__(self, engine: Engine, handle: c_void_p) -> None:
        self.engine, self.handle = engine, handle

    def __iter__(self):
        lib, event = self.engine.lib, POINTER(Event)()
        try:
            while (status := lib.vllm_request_next(self.handle, -1, byref(event))) == VLLM_OK:
                ev = event.contents  # valid until the next call: copy out
                if ev.status != VLLM_OK:
                    raise VllmError(lib, ev.status, ev.error.decode())
                ids = ev.token_ids[: ev.n_token_ids] if ev.n_token_ids else []
                yield ev.text.decode(), ids, FINISH_REASONS[ev.finish_reason] if ev.finished \
                    else None
            if status != VLLM_END_OF_STREAM:
                raise VllmError(lib, status)
        finally:
            self.close()

    def close(self) -> None:
        if self.handle:
            self.engine.lib.vllm_request_free(self.handle)
            self.handle = c_void_p()
