"""Offline tools beside the services: router scorer training, cost reports, the capacity planner.

No running service imports this package; the CLI runs its commands as `python -m` entry points.
"""
