"""`python -m examples.bench.ready_metadata MODEL.gguf [...]`: what carrying a GGUF's
key/values in the engine core's ready message (EngineCoreReady.gguf_metadata) costs a
child core's front end, against re-reading the file's header (what the front end did
before to build its tokenizer and serve vllm_model_meta_*).

Per file: the header read (engine/gguf/reader.py), the msgpack size of its key/values,
the encode (child) and decode (front end) times, whether the round trip gives the same
dict in the same key order, and the Python objects the dict holds (tracemalloc). No
upstream counterpart (vLLM's handshake carries no model metadata).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import msgspec

from libvllm.engine.gguf.reader import GGUFReader


def measure(path: str) -> dict:
    start = time.perf_counter()
    with GGUFReader(path) as reader:
        metadata = dict(reader.metadata)
    read_s = time.perf_counter() - start
    start = time.perf_counter()
    data = msgspec.msgpack.encode(metadata)
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    back = msgspec.msgpack.decode(data)
    decode_s = time.perf_counter() - start
    tracemalloc.start()  # what the front end holds: a second decode, traced (slower)
    held = msgspec.msgpack.decode(data)
    held_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del held
    return {"path": path, "header_read_ms": read_s * 1e3, "msgpack_mb": len(data) / 1e6,
            "encode_ms": encode_s * 1e3, "decode_ms": decode_s * 1e3,
            "dict_mb": held_bytes / 1e6,
            "round_trip_equal": back == metadata and list(back) == list(metadata)}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m examples.bench.ready_metadata")
    parser.add_argument("models", nargs="+", help=".gguf files")
    rows = [measure(path) for path in parser.parse_args(argv).models]
    for row in rows:
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()))
    return rows


if __name__ == "__main__":
    main()
