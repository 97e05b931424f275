"""examples/bench: the benchmark harness (`python -m examples.bench`, see __main__.py),
plus decode.py and kernels.py (standalone scripts). Imports nothing heavy: torch and the
engine load when a benchmark builds its engine."""
