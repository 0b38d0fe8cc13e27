"""Benchmarks: each module runs as `python tools/bench/NAME.py`; what they measure and the
current figures are on docs/benchmarks.md."""
