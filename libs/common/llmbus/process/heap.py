"""The garbage collector of a service process: tuned for a long life of many short requests.

CPython's cycle collector runs its youngest generation every 700 net allocations of container objects
and, now and then, a full collection over every object the process holds: the 80,000-110,000 that
importing a service leaves (modules, classes, pydantic's schemas) and its tables. In the request-path
services that was 4-10 % of their CPU under load (gc.callbacks with process time, c = 64 through the
peer bench's path; `bench/reports/peer_profile.md`). Two changes, measured there:

- once the service has started, what it built is moved out of the collector's sight (`gc.freeze`):
  a full collection then looks at what came later only;
- the youngest generation is collected every `YOUNG_OBJECTS` allocations: most of a request's objects
  are freed by reference counting before that, so they are never traversed nor promoted.

Only a service's own process (`llmbus.bus.runtime.run_service`) is tuned: a test process that runs
many runtimes one after another keeps the interpreter's defaults.
"""

from __future__ import annotations

import gc

YOUNG_OBJECTS = 10_000
_service_process = False


def tune_for_service() -> None:
    """In a service's process, before it starts."""
    global _service_process
    _service_process = True
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS, middle, old)


def freeze_started() -> None:
    """The service has started: what exists now is its lasting state (in a service's process only)."""
    if _service_process:
        gc.collect()
        gc.freeze()
