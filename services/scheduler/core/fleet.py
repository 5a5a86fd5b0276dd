"""The fleet as the scheduler sees it (pure): heartbeats plus its own placements."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from llmbus.messages import WorkerState, WorkerStatus


@dataclass
class WorkerView:
    status: WorkerStatus
    seen_monotonic: float
    placed: set[str] = field(default_factory=set)  # request ids placed and not yet finished

    def load(self) -> int:
        # Own placements count at once; the heartbeat's waiting queue adds what we don't know.
        return len(self.placed) + self.status.num_requests_waiting


class Fleet:
    def __init__(self, stale_s: float) -> None:
        self.stale_s = stale_s
        self.workers: dict[str, WorkerView] = {}

    def observe(self, status: WorkerStatus, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        view = self.workers.get(status.worker_id)
        if view is None:
            self.workers[status.worker_id] = WorkerView(status, now)
        else:
            view.status, view.seen_monotonic = status, now

    def ready_for(
        self, model: str, now: float | None = None, exclude: frozenset[str] = frozenset()
    ) -> list[WorkerView]:
        now = time.monotonic() if now is None else now
        return [
            v
            for v in self.workers.values()
            if v.status.state == WorkerState.READY
            and model in v.status.models
            and now - v.seen_monotonic <= self.stale_s
            and v.status.worker_id not in exclude
        ]

    def least_loaded(self, model: str, exclude: frozenset[str] = frozenset()) -> WorkerView | None:
        candidates = self.ready_for(model, exclude=exclude)
        return min(candidates, key=lambda v: (v.load(), v.status.worker_id)) if candidates else None

    def placed(self, worker_id: str, request_id: str) -> None:
        if (view := self.workers.get(worker_id)) is not None:
            view.placed.add(request_id)

    def finished(self, worker_id: str, request_id: str) -> None:
        if (view := self.workers.get(worker_id)) is not None:
            view.placed.discard(request_id)
