"""capi: the Python side of libvllm.so (cffi embedding). No engine logic lives here."""
