"""The router's flows: each turns a record into calls on RouterCore and publishes what it decides.

- requests.py  llm.requests → validated, limited, routed (llm.routed) or answered (cache, refusal, error)
- results.py   llm.results → the cache filled, latency watched, coalesced followers answered
- state.py     llm.models, llm.experiments, llm.budgets → what routing decides with
"""

from llmbus_services.router.flows.results import ResultFlow
from llmbus_services.router.flows.state import StateFlow


class RouterHandlers(ResultFlow, StateFlow):
    """Every flow of the router over one RouterCore, wired in app.py."""


__all__ = ["RouterHandlers"]
