"""Triton kernels (GPU path); each file: launcher, _kernel, torch reference."""
