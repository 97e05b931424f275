"""Triton kernels (GPU path); each file: launcher, _kernel, torch reference.

The bottom layer: nothing here imports engine/ (tests/test_layering.py). The errors
launchers raise (errors.py) and the GGML type table (ggml_types.py) live here and
engine/ re-exports them.
"""
