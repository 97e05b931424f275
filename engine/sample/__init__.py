"""engine.sample: see docs/architecture.md."""
