"""The scheduler's flows: each turns records into calls on SchedulerCore and acts on what it decides.

- routed.py    llm.routed → `submit`; the record held open until placed or answered; hand-over on revoke
- fleet.py     llm.workers / llm.nodes / llm.models → the fleet view; llm.control cancels a queued request
- outcomes.py  llm.outcomes → release the placement, retry or give up; the timer's deadlines and dead workers
- placement.py what they all end in: a placement claimed and its Dispatch sent, or a final error
"""

from llmbus_services.scheduler.flows.fleet import FleetFlow
from llmbus_services.scheduler.flows.outcomes import OutcomeFlow
from llmbus_services.scheduler.flows.routed import RoutedFlow


class SchedulerHandlers(RoutedFlow, FleetFlow, OutcomeFlow):
    """Every flow of the scheduler over one state (queues, placements, the lock), wired in app.py."""


__all__ = ["SchedulerHandlers"]
