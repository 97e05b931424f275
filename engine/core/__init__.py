"""engine.core: see docs/architecture.md."""
