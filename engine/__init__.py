"""libvllm engine: a vLLM-v1-shaped inference engine in Python (torch + Triton).

Module names mirror vllm/v1 so each file traces to its upstream counterpart.
"""

__version__ = "1.3.0"  # ABI major.minor (include/vllm.h) + a patch number
