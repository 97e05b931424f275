"""MsgpackEncoder / MsgpackDecoder: the wire format of the engine-core sockets, as
vllm/v1/serial_utils.py.

msgspec msgpack with typed decoding (msgspec structs, dataclasses, enums). numpy arrays
and CPU torch tensors travel as raw buffers: small ones inline in an ext type, those of
`size_threshold` bytes or more as their own zmq frame (sent without a copy; the decoder
wraps the received frame without a copy), the message being frame 0. Nothing is ever
pickled: an object msgspec cannot encode natively is a TypeError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

_EXT_NDARRAY = 1  # payload: msgpack [dtype str, shape, data bytes | aux frame index]
_EXT_TENSOR = 2  # the same, rebuilt as a torch tensor
_SIZE_THRESHOLD = 256  # vLLM's VLLM_MSGPACK_ZERO_COPY_THRESHOLD default

Bytestr = bytes | bytearray | memoryview


class MsgpackEncoder:
    """encode(obj) -> a list of buffers: the message, then any large array data."""

    def __init__(self, size_threshold: int = _SIZE_THRESHOLD) -> None:
        self.encoder = msgspec.msgpack.Encoder(enc_hook=self.enc_hook)
        self.size_threshold = size_threshold
        self.aux_buffers: list[Bytestr] | None = None

    def encode(self, obj: Any) -> list[Bytestr]:
        try:
            self.aux_buffers = bufs = [b""]
            bufs[0] = self.encoder.encode(obj)
            return bufs
        finally:
            self.aux_buffers = None

    def enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return self._encode_array(obj, _EXT_NDARRAY)
        torch = _torch_if_loaded()
        if torch is not None and isinstance(obj, torch.Tensor):
            if obj.device.type != "cpu":
                raise TypeError("only CPU tensors can cross the engine-core socket")
            arr = obj.detach().contiguous()
            dtype = str(arr.dtype).removeprefix("torch.")
            data = arr.view(torch.uint8).numpy() if arr.numel() else np.zeros(0, np.uint8)
            return msgspec.msgpack.Ext(_EXT_TENSOR, msgspec.msgpack.encode(
                [dtype, list(arr.shape), self._data(data.reshape(-1))]))
        raise TypeError(f"{type(obj).__name__} cannot cross the engine-core socket")

    def _encode_array(self, arr: np.ndarray, code: int) -> msgspec.msgpack.Ext:
        if arr.dtype.hasobject:
            raise TypeError("object arrays cannot cross the engine-core socket")
        arr = np.ascontiguousarray(arr)
        return msgspec.msgpack.Ext(code, msgspec.msgpack.encode(
            [arr.dtype.str, list(arr.shape), self._data(arr.reshape(-1).view(np.uint8))]))

    def _data(self, flat: np.ndarray) -> bytes | int:
        """Inline bytes, or the index of the aux frame that holds them."""
        if flat.nbytes < self.size_threshold or self.aux_buffers is None:
            return flat.tobytes()
        self.aux_buffers.append(memoryview(flat))
        return len(self.aux_buffers) - 1


class MsgpackDecoder:
    """decode(frames) -> an object of type t (None: untyped)."""

    def __init__(self, t: Any = None) -> None:
        args = () if t is None else (t,)
        self.decoder = msgspec.msgpack.Decoder(*args, ext_hook=self.ext_hook)
        self.aux_buffers: Sequence[Bytestr] = ()

    def decode(self, frames: Bytestr | Sequence[Bytestr]) -> Any:
        if isinstance(frames, (bytes, bytearray, memoryview)):
            frames = (frames,)
        self.aux_buffers = frames
        try:
            return self.decoder.decode(frames[0])
        finally:
            self.aux_buffers = ()

    def ext_hook(self, code: int, data: memoryview) -> Any:
        if code not in (_EXT_NDARRAY, _EXT_TENSOR):
            raise TypeError(f"unknown msgpack extension type {code}")
        dtype, shape, raw = msgspec.msgpack.decode(data)
        buf = self.aux_buffers[raw] if isinstance(raw, int) else raw
        if code == _EXT_NDARRAY:
            return np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape)
        import torch

        flat = torch.frombuffer(bytearray(buf), dtype=torch.uint8) if len(buf) \
            else torch.empty(0, dtype=torch.uint8)
        return flat.view(getattr(torch, dtype)).reshape(shape)


def _torch_if_loaded():
    """torch if this process imported it (the front end of a C host may not have)."""
    import sys

    return sys.modules.get("torch")
