"""capi.caller_driven: the caller-driven request functions of include/vllm.h
(vllm_request_add, vllm_request_abort, vllm_engine_step, vllm_engine_num_unfinished).

Several threads may step one engine (vllm.h, "Thread safety"): a request belongs to the
thread that added it. Any thread's step runs the engine for every request (continuous
batching) and routes each output to its owner's queue; a step returns the calling
thread's queue. The C array and strings a step returns live until that thread's next
step (or the engine's free), so one thread's step never frees what another reads. A
thread that added no request to the engine, when no engine work is left but other
threads' outputs wait, gets VLLM_ERR_INVALID_STATE instead of spinning forever.

Mirrors vllm/v1/engine/llm_engine.py (add_request, abort_request, step,
get_num_unfinished_requests) at the C boundary; the routing is ours (vLLM's LLMEngine is
single-threaded).
"""

from __future__ import annotations

import threading

from _libvllm import ffi

from capi import streams, typed_outputs
from capi.generation_defaults import apply_generation_config
from capi.plumbing import (
    FINISH_REASONS,
    EngineRecord,
    InvalidStateError,
    engines,
    export,
    prompt_arg,
    sampling_params,
    text,
)
from capi.typed_outputs import RequestTimes
from engine.errors import InvalidArgumentError, NotFoundError

_EMPTY = ffi.new("char[]", b"")


@export
def glue_request_add(key, request_id, prompt, prompt_token_ids, n_prompt_token_ids, params):
    record = engines.get_live(key)
    rid = text(request_id, "request_id")
    apply_generation_config(params, record.engine.default_sampling_params)
    sampling = sampling_params(params)
    with record.lock:
        record.require_caller_driven("vllm_request_add")
        if rid in record.requests:  # includes ones whose last output is still due
            raise InvalidArgumentError(f"request id {rid!r} is already in use")
        times = RequestTimes.for_params(sampling)
        record.engine.add_request(rid, prompt_arg(prompt, prompt_token_ids, n_prompt_token_ids),
                                  sampling)
        record.requests[rid] = times
        record.owners[rid] = threading.get_ident()
        record.adders.add(threading.get_ident())


@export
def glue_request_abort(key, request_id) -> None:
    record = engines.get_live(key)
    rid = text(request_id, "request_id")
    with record.lock:
        if record.loop is not None:
            if not record.loop.has_request(rid):
                raise NotFoundError(f"no running request with id {rid!r}")
            record.loop.abort(rid)
        else:
            record.engine.abort_request(rid)


def _route(record: EngineRecord, results) -> None:
    """Each sequence's output to its owner's queue as (RequestOutput, completion, its
    tokens so far, its first-token latency, the request's last output or not)."""
    for result in results:
        rid = result.request_id
        times, queue = record.requests[rid], record.pending.setdefault(record.owners[rid], [])
        for i, completion in enumerate(result.outputs):
            last = result.finished and i == len(result.outputs) - 1
            queue.append((result, completion, *times.observe(completion), last))


def _outputs_array(record: EngineRecord, outputs: list) -> tuple[object, list]:
    """A vllm_request_output array for what _route queued, and every cdata it points
    into. Requests whose last output this is are forgotten."""
    array = ffi.new("vllm_request_output[]", len(outputs))
    memory = [array]
    for out, (result, completion, num_output_tokens, latency, last) in zip(array, outputs):
        typed_outputs.fill(out, completion, latency, record.requests[result.request_id], last,
                           memory)
        rid = ffi.new("char[]", result.request_id.encode("utf-8"))
        delta = ffi.new("char[]", completion.text.encode("utf-8", "replace"))
        ids = ffi.new("int32_t[]", completion.token_ids)
        memory += [rid, delta, ids]
        out.request_id, out.text = rid, delta
        out.token_ids, out.n_token_ids = ids, len(completion.token_ids)
        out.finished = int(last)
        out.finish_reason = FINISH_REASONS[completion.finish_reason]
        out.num_prompt_tokens = len(result.prompt_token_ids)
        out.num_output_tokens = num_output_tokens
        out.status, out.error = streams.error_status(result.error), _EMPTY
        if result.error is not None:  # the owner kept, not the pointer read back
            message = ffi.new("char[]", streams.error_message(result.error))
            memory.append(message)
            out.error = message
        if last:
            del record.requests[result.request_id], record.owners[result.request_id]
    return array, memory


@export
def glue_engine_step(key, outputs, n_outputs) -> None:
    record = engines.get_live(key)
    me = threading.get_ident()
    with record.lock:
        record.require_caller_driven("vllm_engine_step")
        record.step_memory.pop(me, None)  # this thread's previous outputs end here
        engine = record.engine
        results = engine.step() if engine.has_unfinished_requests() else []
        record.stats.observe(results)
        _route(record, results)
        mine = record.pending.pop(me, [])
        if not results and not mine and record.requests and me not in record.adders:
            raise InvalidStateError(
                f"vllm_engine_step: the engine's {len(record.requests)} unfinished request(s) "
                "were added by other threads; their outputs go to the thread that added "
                "each request (step there, or use the background loop)")
        if mine:
            array, record.step_memory[me] = _outputs_array(record, mine)
            outputs[0], n_outputs[0] = array, len(mine)


@export
def glue_engine_num_unfinished(key, n) -> None:
    record = engines.get_live(key)
    with record.lock:
        n[0] = streams.num_unfinished(record) if record.loop else len(record.requests)
