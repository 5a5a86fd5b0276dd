"""Offline tools beside the services: router scorer training, cost reports, the capacity planner,
and the harness benchmarks and tests both run (harness/).

No running service imports this package; the CLI runs its commands as `python -m` entry points.
"""
