"""engine-worker's flows: each turns a record into calls on its engine and core/, and publishes the outcome.

- dispatch.py  llm.dispatch.<worker_id> -> the engine's stream: chunks, one result (fenced), one outcome
- control.py   llm.control -> cancel a running request, drain this worker; abort what still runs at the end
"""

from llmbus_services.engine_worker.flows.control import ControlFlow
from llmbus_services.engine_worker.flows.dispatch import ResultOut, RunSite


class WorkerHandlers(ControlFlow):
    """Every flow of the worker over one engine and one set of running attempts, wired in app.py."""


__all__ = ["ResultOut", "RunSite", "WorkerHandlers"]
