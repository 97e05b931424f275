"""engine.worker: see docs/architecture.md."""
