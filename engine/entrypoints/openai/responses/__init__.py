"""POST /v1/responses, GET /v1/responses/{id}, POST /v1/responses/{id}/cancel (vLLM's
vllm/entrypoints/openai/responses/), served through the chat completions path."""
