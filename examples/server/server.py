"""vllm-server: an OpenAI-compatible HTTP server on libvllm.so (a thin client of vllm.h).

    python examples/server/server.py MODEL.gguf [--host 127.0.0.1] [--port 8000]
        [--api-key KEY] [--served-model-name NAME] [--max-model-len N] [--max-num-seqs N]
        [--max-num-queued-reqs N] [--shutdown-timeout S] ...

Flags are named as `vllm serve`'s (vllm/entrypoints/cli/serve.py, vllm/engine/arg_utils.py);
the API key also comes from VLLM_API_KEY. The model loads after the port is open: /health
answers 503 until it is ready (llama.cpp's behaviour). SIGTERM or SIGINT: /health turns
503, new requests get 503 with Retry-After, in-flight ones get --shutdown-timeout seconds
(vLLM's default 0: abort them at once), then the rest is cancelled and the engine freed; a
second signal exits at once. Needs starlette and uvicorn (pyproject's `server` extra).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from contextlib import asynccontextmanager

import anyio
import uvicorn
from app import ServerState, build_app
from idle_trim import limit_arenas
from libvllm_ctypes import LibVLLM
from limits import MAX_HEAD_BYTES, HeadLimitH11Protocol
from load_progress_log import LoadProgressLog

logger = logging.getLogger("vllm.server")
_CANCEL_GRACE_S = 5.0  # after the drain: how long cancelled requests get to end
# compiled grammars xgrammar may keep (VLLM_XGRAMMAR_CACHE_MB, read by the engine): vLLM's
# 512 MB is sized for GPU hosts whose RSS is many GB; a set variable wins
XGRAMMAR_CACHE_MB = "256"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vllm-server", description=__doc__.split("\n")[0])
    p.add_argument("model_tag", nargs="?", help="the GGUF model file or a Hugging Face "
                   "directory (as `vllm serve MODEL`)")
    p.add_argument("--model", help="the GGUF model file (instead of the positional argument)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", action="append", default=None,
                   help="require this key (repeatable); default: env VLLM_API_KEY")
    p.add_argument("--served-model-name", help="the model's name in the API; default: --model")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--block-size", type=int)
    p.add_argument("--kv-cache-memory-bytes", type=int)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    p.add_argument("--enforce-eager", action="store_true", default=None)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                   help="schedule step N+1 while step N runs (default: on with CUDA)")
    p.add_argument("--multiprocessing", action=argparse.BooleanOptionalAction,
                   help="the engine core in its own process (default: on with CUDA)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int,
                   help="vLLM's tensor parallelism: ranks (GPUs) to shard the model over")
    p.add_argument("--chat-template", help="a template file or the template text")
    p.add_argument("--tokenizer", help="a Hugging Face tokenizer directory; default: the model's")
    p.add_argument("--load-format", choices=["auto", "dummy"],
                   help="dummy: random weights shaped by the model directory's config.json")
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--skip-tokenizer-init", action="store_true", default=None,
                   help="no tokenizer: token-id prompts only (completions), token-id outputs")
    p.add_argument("--structured-outputs-config.backend", dest="structured_outputs_backend",
                   choices=["auto", "xgrammar", "guidance"])
    p.add_argument("--reasoning-parser", help="deepseek_r1 | qwen3: split <think> reasoning")
    p.add_argument("--reasoning-config", type=json.loads, default=None,
                   help='JSON: {"reasoning_parser", "reasoning_start_str", '
                   '"reasoning_end_str"} (the markers of thinking_token_budget); unlike vLLM '
                   'its reasoning_parser also parses the output when --reasoning-parser is '
                   'not given')
    p.add_argument("--tool-call-parser", help="hermes | llama3_json | mistral | pythonic | ...")
    p.add_argument("--enable-auto-tool-choice", action="store_true", default=None,
                   help='parse tool calls for tool_choice "auto" (needs --tool-call-parser)')
    p.add_argument("--tool-strict-level", choices=["auto", "function", "parameter"],
                   help="the floor of strict tool calling (default: the parser's, auto: "
                   "calls constrained when a tool is strict)")
    p.add_argument("--quantization", "-q", help="fp8 | compressed-tensors; default: the "
                   "checkpoint's (fp8 on an unquantized checkpoint: dynamic FP8 at load)")
    p.add_argument("--kv-cache-dtype", help="auto (the model's dtype) | fp8 | fp8_e4m3")
    p.add_argument("--calculate-kv-scales", action="store_true", default=None,
                   help="compute the fp8 KV cache's scales from the data")
    p.add_argument("--mamba-cache-dtype", help="hybrid models' recurrent state: auto | "
                   "float32 | float16 | bfloat16")
    p.add_argument("--mamba-ssm-cache-dtype", help="as --mamba-cache-dtype, the SSM state")
    p.add_argument("--mamba-cache-mode", help="deprecated as in vLLM, no effect (a warning): "
                   "the mode is align with prefix caching, else none")
    p.add_argument("--runner", choices=["auto", "generate", "pooling"],
                   help="pooling: an embedding engine (/v1/embeddings, /pooling, /score, "
                   "/rerank) instead of a generating one")
    p.add_argument("--convert", choices=["auto", "none", "embed", "classify"],
                   help="embed: the *ForCausalLM served as an embedding model")
    p.add_argument("--pooler-config", help='vLLM\'s PoolerConfig as JSON, e.g. '
                   '{"pooling_type": "MEAN"}')
    p.add_argument("--max-num-queued-reqs", "--max-queued-requests", type=int, default=1024,
                   help="requests in flight beyond which new ones get 503 + Retry-After")
    p.add_argument("--shutdown-timeout", type=float, default=0.0,
                   help="seconds in-flight requests may finish after SIGTERM")
    p.add_argument("--body-read-timeout", type=float, default=30.0,
                   help="seconds to wait for more of a request body before answering 408")
    p.add_argument("--lib", help="libvllm.so to load; default: env VLLM_LIB, build/libvllm.so")
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    args = p.parse_args(argv)
    args.model = args.model or args.model_tag
    if not args.model:
        p.error("the model (a GGUF file) is required")
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        p.error("--enable-auto-tool-choice requires --tool-call-parser")
    if args.max_num_queued_reqs < 1:
        p.error("--max-num-queued-reqs must be at least 1")
    _reasoning_config(p, args)
    env_key = os.environ.get("VLLM_API_KEY")
    args.api_key = args.api_key or ([env_key] if env_key else [])
    return args


def _reasoning_config(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--reasoning-config (vLLM's ReasoningConfig) -> the parser and the two markers."""
    config = args.reasoning_config or {}
    names = ("reasoning_parser", "reasoning_start_str", "reasoning_end_str")
    if not isinstance(config, dict) or not set(config) <= set(names) or not all(
            isinstance(v, str) for v in config.values()):
        p.error(f"--reasoning-config must be a JSON object of strings with keys {names}")
    args.reasoning_parser = args.reasoning_parser or config.get("reasoning_parser")
    args.reasoning_start_str = config.get("reasoning_start_str") or None
    args.reasoning_end_str = config.get("reasoning_end_str") or None


def engine_fields(args: argparse.Namespace) -> dict:
    """vllm_engine_params fields set on the command line (None: the library's default)."""
    names = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
             "kv_cache_memory_bytes", "device", "dtype", "seed", "enable_prefix_caching",
             "enable_chunked_prefill", "enforce_eager", "served_model_name", "chat_template",
             "tokenizer", "structured_outputs_backend", "reasoning_parser", "tool_call_parser",
             "enable_auto_tool_choice", "load_format", "gpu_memory_utilization",
             "skip_tokenizer_init", "tool_strict_level", "reasoning_start_str",
             "reasoning_end_str", "quantization", "kv_cache_dtype", "calculate_kv_scales",
             "mamba_cache_dtype", "mamba_ssm_cache_dtype", "mamba_cache_mode", "runner",
             "convert", "pooler_config")
    fields = {name: getattr(args, name) for name in names}
    if args.max_num_batched_tokens is None and args.enable_chunked_prefill is not False:
        fields["max_num_batched_tokens"] = 8192  # `vllm serve`'s (the library's: 16384 on H200)
    if args.async_scheduling is not None:  # vllm.h: 1 on, -1 off, 0 the engine's default
        fields["async_scheduling"] = 1 if args.async_scheduling else -1
    if args.multiprocessing is not None:
        fields["multiprocessing"] = 1 if args.multiprocessing else -1
    if args.tensor_parallel_size is not None:
        fields["tensor_parallel_size"] = args.tensor_parallel_size
    return fields


class Server(uvicorn.Server):
    """uvicorn with a drain: the first signal stops admission and waits for in-flight
    requests, up to the shutdown timeout."""

    def __init__(self, config: uvicorn.Config, state: ServerState, args) -> None:
        super().__init__(config)
        self.state, self.args = state, args
        self.load_failed = False
        self.loader = threading.Thread(target=self._load, name="vllm-load", daemon=True)

    def _load(self) -> None:
        try:
            started = time.monotonic()
            self.state.lib.create_engine(self.args.model, progress=LoadProgressLog(logger),
                                         **engine_fields(self.args))
            self.state.ready = True
            logger.info("model %s ready in %.1f s", self.args.model, time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - a server without a model exits
            logger.error("cannot load %s: %s", self.args.model, exc)
            self.load_failed = True
            self.should_exit = True

    def handle_exit(self, sig, frame) -> None:
        if self.state.draining or not self.state.ready:
            super().handle_exit(sig, frame)
            return
        logger.info("draining: %d request(s) in flight, %.0f s to finish",
                    self.state.in_flight, self.args.shutdown_timeout)
        self.state.draining = True
        threading.Thread(target=self._drain, name="vllm-drain", daemon=True).start()

    def _drain(self) -> None:
        self._wait_idle(self.args.shutdown_timeout)
        for stream in list(self.state.streams):
            self.state.lib.stream_cancel(stream)
        if not self._wait_idle(_CANCEL_GRACE_S):  # non-streamed requests have no handle:
            self.state.lib.free_engine()  # freeing the engine aborts them
        self.should_exit = True

    def _wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.state.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.state.in_flight


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_XGRAMMAR_CACHE_MB", XGRAMMAR_CACHE_MB)
    limit_arenas()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    lib = LibVLLM(args.lib)
    state = ServerState(lib, args.served_model_name or args.model, args.max_num_queued_reqs,
                        args.body_read_timeout)
    server: Server

    @asynccontextmanager
    async def lifespan(app):
        server.loader.start()
        yield
        state.ready = False
        await anyio.to_thread.run_sync(server.loader.join)
        await anyio.to_thread.run_sync(lib.shutdown)

    config = uvicorn.Config(build_app(state, args.api_key, lifespan), host=args.host,
                            port=args.port, log_level=args.uvicorn_log_level,
                            timeout_graceful_shutdown=5, http=HeadLimitH11Protocol,
                            h11_max_incomplete_event_size=MAX_HEAD_BYTES + 4)
    server = Server(config, state, args)
    server.run()
    return 1 if server.load_failed else 0


if __name__ == "__main__":
    sys.exit(main())
