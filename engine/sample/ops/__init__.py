"""engine.sample.ops: batched logits transforms of the Sampler (vllm/v1/sample/ops)."""
