"""Entry points on top of the engine: the OpenAI-compatible request layer (openai/).

Mirrors vllm/entrypoints/. Everything here is reached through include/vllm.h
(vllm_openai_request); the HTTP server in examples/server only frames what it returns.
"""
