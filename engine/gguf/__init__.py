"""engine.gguf: see docs/architecture.md."""
