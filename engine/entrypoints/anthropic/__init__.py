"""POST /v1/messages and /v1/messages/count_tokens (vLLM's vllm/entrypoints/anthropic/),
served through the chat completions path."""
