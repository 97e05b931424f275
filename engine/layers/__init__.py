"""engine.layers: see docs/architecture.md."""
