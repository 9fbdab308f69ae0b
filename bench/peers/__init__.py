"""Benchmarks of sessionlog against peer libraries that store agent conversations.

`python -m bench.peers` runs one adapter per library, each in its own process, over the same
workloads (bench/peers/_workloads.py) and prints one table with ratios to sessionlog. Adapters
touch only their own library's public API; this package never imports a peer at module level,
so the driver runs in an environment where only some peers are installed.
"""
