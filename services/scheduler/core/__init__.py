"""Pure placement policy of the scheduler: fleet view, plugin pipeline, flow queue, recovery.

Nothing here imports the broker or Redis: handlers turn messages into calls on `SchedulerCore`
and publish the actions it returns, so the same code runs in the service, in unit tests and
in the virtual-time benchmark (bench/sched_bench.py).
"""
