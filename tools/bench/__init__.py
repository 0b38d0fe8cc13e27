"""Benchmarks (see DESIGN.md "Benchmarks"): each module runs as `python tools/bench/NAME.py`."""
