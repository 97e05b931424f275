"""engine.models: see docs/architecture.md."""
