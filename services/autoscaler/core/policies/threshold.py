"""The design source's rule, completed with the latency trigger its KEDA example implies.

Two triggers, either scales the pool up by `step_up`:
- queue wait: the median queue wait above `target_queue_wait_ms` for `up_after_s` without a break;
- latency: the TTFT quantile (`ttft_quantile`, p99) over the scheduler's latency window above the
  tier's `ttft_target_ms` for `latency_up_after_s` without a break. Requests admitted into a batch
  wait inside the engine behind each other's prefills, where queue wait does not see them; their
  TTFT does. A window in which too few requests finished (`min_ttft_samples`) says nothing and
  keeps the streak, so a lull inside a burst does not restart the clock.
Both clocks run only while no capacity is on its way: while a worker warms, or the workers of the
last scale-up have yet to report ready (at most `ready_timeout_s`), the wait is what the cold start
costs, not evidence that the pool is too small.
No traffic (no arrivals, nothing queued or running) for `idle_after_s` → down to the minimum (or by
`step_down` when it is > 0); the minimum may be 0. After any change nothing changes for
`cooldown_s` (anti-flapping) — except waking a pool at zero: a request waiting on an empty pool
starts one worker at once (it then waits a cold start). A pool is empty when no worker serves it,
not only none of the autoscaler's own: workers it did not start (static ones) count in
`current_replicas` nowhere, but they do serve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from llmbus_services.autoscaler.core.base import POLICIES, Bounds, Decision, PolicyParams
from llmbus_services.autoscaler.core.signals import PoolSignals
from llmbus_services.autoscaler.core.timers import Sustained


class ThresholdParams(PolicyParams):
    target_queue_wait_ms: float = Field(default=300.0, gt=0)
    up_after_s: float = Field(default=180.0, ge=0, description="queue wait above target this long → up")
    ttft_target_ms: float | None = Field(default=2000.0, gt=0, description="the tier's TTFT target; None: no trigger")
    ttft_quantile: Literal["p50", "p90", "p99"] = "p99"
    latency_up_after_s: float = Field(default=180.0, ge=0, description="TTFT above target this long → up")
    min_ttft_samples: int = Field(default=20, ge=1, description="fewer finished requests in the window: no evidence")
    idle_after_s: float = Field(default=600.0, ge=0)
    cooldown_s: float = Field(default=300.0, ge=0)
    step_up: int = Field(default=1, ge=1)
    step_down: int = Field(default=0, ge=0, description="0: straight to the minimum")
    ready_timeout_s: float = Field(
        default=600.0, gt=0, description="a scale-up's workers not ready by then: waits count"
    )


@POLICIES.register("threshold")
@dataclass
class ThresholdPolicy:
    Params = ThresholdParams

    bounds: Bounds = field(default_factory=Bounds)
    params: ThresholdParams = field(default_factory=ThresholdParams)
    name: str = "threshold"
    _wait_high: Sustained = field(default_factory=Sustained)
    _latency_high: Sustained = field(default_factory=Sustained)
    _expect_ready: int = 0  # ready workers the last scale-up should give
    _expect_by_ms: int = 0
    _busy_at_ms: int | None = None  # last time the pool had traffic
    _changed_at_ms: int | None = None

    def decide(self, signals: PoolSignals, current_replicas: int) -> Decision:
        p = self.params
        now = signals.now_ms
        wait_ms = signals.queue_wait_ms
        not_ready_yet = signals.workers_ready < self._expect_ready and now < self._expect_by_ms
        coming = signals.workers_warming > 0 or not_ready_yet
        high_s = self._wait_high.update(now, wait_ms > p.target_queue_wait_ms and not coming)
        target_ms, quantile = p.ttft_target_ms, p.ttft_quantile
        slow = None if target_ms is None else signals.ttft_over(target_ms, quantile, p.min_ttft_samples)
        if signals.idle:  # nobody waits for a first token: the latency window's old samples are no evidence
            slow = False
        slow_s = self._latency_high.update(now, False if coming else slow)
        if not signals.idle or self._busy_at_ms is None:
            self._busy_at_ms = now
        idle_s = (now - self._busy_at_ms) / 1000
        values = signals.values() | {"high_for_s": high_s, "ttft_high_for_s": slow_s, "idle_for_s": idle_s}

        def hold(reason: str) -> Decision:
            return Decision(current_replicas, current_replicas, reason, values)

        def change(desired: int, reason: str) -> Decision:
            desired = self.bounds.clamp(desired)
            if desired == current_replicas:
                return hold(reason + " (at bound)")
            self._changed_at_ms = now
            # the new capacity must prove itself for a full period again
            self._wait_high.reset()
            self._latency_high.reset()
            # static workers count as ready too: expect the ones there now plus the ones added
            self._expect_ready = signals.workers_ready + max(0, desired - current_replicas)
            self._expect_by_ms = now + int(p.ready_timeout_s * 1000)
            return Decision(current_replicas, desired, reason, values)

        if current_replicas < self.bounds.min_replicas:
            return change(self.bounds.min_replicas, "below the pool minimum")
        # "At zero": none of ours and no other live worker serving the pool (make up's static ones).
        at_zero = current_replicas == 0 and signals.workers_ready + signals.workers_warming == 0
        if at_zero and (signals.queued or signals.arrivals):
            return change(max(1, p.step_up), "request waiting on a pool at zero: cold start")
        cooling_s = p.cooldown_s - (now - self._changed_at_ms) / 1000 if self._changed_at_ms is not None else 0.0
        triggered = []
        if high_s >= p.up_after_s:
            triggered.append(f"median queue wait {wait_ms:.0f} ms > {p.target_queue_wait_ms:.0f} ms for {high_s:.0f}s")
        if slow_s >= p.latency_up_after_s:
            ttft = signals.ttft_ms(p.ttft_quantile) or 0.0
            triggered.append(f"{p.ttft_quantile} TTFT {ttft:.0f} ms > {p.ttft_target_ms:.0f} ms for {slow_s:.0f}s")
        if triggered:
            if cooling_s > 0:
                return hold(f"{'; '.join(triggered)}, but cooling down ({cooling_s:.0f}s left)")
            return change(current_replicas + p.step_up, "; ".join(triggered))
        if idle_s >= p.idle_after_s and current_replicas > self.bounds.min_replicas:
            if cooling_s > 0:
                return hold(f"idle but cooling down ({cooling_s:.0f}s left)")
            target = self.bounds.min_replicas if p.step_down <= 0 else current_replicas - p.step_down
            return change(target, f"no traffic for {idle_s:.0f}s")
        return hold("within target")
