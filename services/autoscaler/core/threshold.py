"""The design source's rule: sustained queue wait → up; a quiet pool → down to its minimum.

- median queue wait above `target_queue_wait_ms` for `up_after_s` without a break → up by `step_up`;
  the clock runs only while no capacity is on its way: while a worker warms, or the workers of
  the last scale-up have yet to report ready (at most `ready_timeout_s`), the wait is what the
  cold start costs, not evidence that the pool is too small;
- no traffic (no arrivals, nothing queued or running) for `idle_after_s` → down to the minimum
  (or by `step_down` when it is > 0); the minimum may be 0;
- after any change, nothing changes for `cooldown_s` (anti-flapping) — except waking a pool at
  zero: a request waiting on an empty pool starts one worker at once (it then waits a cold start).
  A pool is empty when no worker serves it, not only none of the autoscaler's own: workers it
  did not start (static ones) count in `current_replicas` nowhere, but they do serve.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus_services.autoscaler.core.base import Bounds, Decision, register
from llmbus_services.autoscaler.core.signals import PoolSignals


@register("threshold")
@dataclass
class ThresholdPolicy:
    bounds: Bounds = field(default_factory=Bounds)
    target_queue_wait_ms: float = 300.0
    up_after_s: float = 180.0
    idle_after_s: float = 600.0
    cooldown_s: float = 300.0
    step_up: int = 1
    step_down: int = 0  # 0: straight to the minimum
    ready_timeout_s: float = 600.0  # a worker not ready this long after a scale-up: its wait counts again
    name: str = "threshold"
    _high_since_ms: int | None = None
    _expect_ready: int = 0  # ready workers the last scale-up should give
    _expect_by_ms: int = 0
    _busy_at_ms: int | None = None  # last time the pool had traffic
    _changed_at_ms: int | None = None

    def decide(self, signals: PoolSignals, current_replicas: int) -> Decision:
        now = signals.now_ms
        wait_ms = signals.queue_wait_ms
        not_ready_yet = signals.workers_ready < self._expect_ready and now < self._expect_by_ms
        coming = signals.workers_warming > 0 or not_ready_yet
        if wait_ms > self.target_queue_wait_ms and not coming:
            self._high_since_ms = now if self._high_since_ms is None else self._high_since_ms
        else:
            self._high_since_ms = None
        if not signals.idle or self._busy_at_ms is None:
            self._busy_at_ms = now
        values = signals.values()
        high_s = (now - self._high_since_ms) / 1000 if self._high_since_ms is not None else 0.0
        idle_s = (now - self._busy_at_ms) / 1000
        values |= {"high_for_s": high_s, "idle_for_s": idle_s}

        def hold(reason: str) -> Decision:
            return Decision(current_replicas, current_replicas, reason, values)

        def change(desired: int, reason: str) -> Decision:
            desired = self.bounds.clamp(desired)
            if desired == current_replicas:
                return hold(reason + " (at bound)")
            self._changed_at_ms = now
            self._high_since_ms = None  # the new capacity must prove itself for a full period again
            # static workers count as ready too: expect the ones there now plus the ones added
            self._expect_ready = signals.workers_ready + max(0, desired - current_replicas)
            self._expect_by_ms = now + int(self.ready_timeout_s * 1000)
            return Decision(current_replicas, desired, reason, values)

        if current_replicas < self.bounds.min_replicas:
            return change(self.bounds.min_replicas, "below the pool minimum")
        # "At zero": none of ours and no other live worker serving the pool (make up's static ones).
        at_zero = current_replicas == 0 and signals.workers_ready + signals.workers_warming == 0
        if at_zero and (signals.queued or signals.arrivals):
            return change(max(1, self.step_up), "request waiting on a pool at zero: cold start")
        cooling_s = self.cooldown_s - (now - self._changed_at_ms) / 1000 if self._changed_at_ms is not None else 0.0
        if high_s >= self.up_after_s:
            if cooling_s > 0:
                return hold(f"queue wait high but cooling down ({cooling_s:.0f}s left)")
            return change(
                current_replicas + self.step_up,
                f"median queue wait {wait_ms:.0f} ms > {self.target_queue_wait_ms:.0f} ms for {high_s:.0f}s",
            )
        if idle_s >= self.idle_after_s and current_replicas > self.bounds.min_replicas:
            if cooling_s > 0:
                return hold(f"idle but cooling down ({cooling_s:.0f}s left)")
            target = self.bounds.min_replicas if self.step_down <= 0 else current_replicas - self.step_down
            return change(target, f"no traffic for {idle_s:.0f}s")
        return hold("within target")
