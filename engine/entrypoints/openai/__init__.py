"""OpenAI-compatible API layer: request body in, response JSON or stream chunks out.

Mirrors vllm/entrypoints/openai/** and vllm/entrypoints/serve/** of vLLM 0.33, without
the HTTP part: api.handle_openai_request is the one entry point.
"""
