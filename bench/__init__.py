"""sessionlog's benchmarks: `python -m bench` (or `make bench`); `--quick` for a smoke run.

Performance is measured here and only here. Every figure is a median over alternating rounds and
is printed next to a baseline measured in the same run, with the ratio and the target.
"""

__all__: list[str] = []
