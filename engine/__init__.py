"""libvllm engine: a vLLM-v1-shaped inference engine in Python (torch + Triton).

Module names mirror vllm/v1 so each file traces to its upstream counterpart.
"""

__version__ = "0.1.0"
