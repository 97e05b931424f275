"""examples/python: stream a greedy completion from libvllm.so through ctypes.

    make build/libvllm.so
    .venv/bin/python examples/python/generate.py MODEL.gguf "The capital of France is"

Run it with the python of the environment libvllm was built with (same minor version).
"""

from __future__ import annotations

import sys

import vllm_ctypes


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} MODEL.gguf PROMPT", file=sys.stderr)
        return 2
    lib = vllm_ctypes.load()
    try:
        with vllm_ctypes.Engine(lib, argv[1]) as engine:
            tokens, reason = 0, None
            for text, ids, finish_reason in engine.generate("py-0", argv[2], 32):
                print(text, end="", flush=True)
                tokens += len(ids)
                reason = finish_reason or reason
            m = engine.metrics()
            print(f"\n[{tokens} tokens, finish={reason}, prompt tokens counted: "
                  f"{m.prompt_tokens}]")
    except vllm_ctypes.VllmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        lib.vllm_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
