"""Driving a scaling policy through virtual time in the policy tests: one evaluation every STEP_S."""

from __future__ import annotations

from collections.abc import Callable

from llmbus_services.autoscaler.core import PoolSignals, ScalingPolicy

STEP_S = 5


def sig(t_s: float, wait_ms: float | None = None, arrivals: int = 0, **kw: object) -> PoolSignals:
    """One pool's signals at `t_s` over a STEP_S window: the median queue wait, arrivals and any other field."""
    return PoolSignals(
        pool="p",
        now_ms=int(t_s * 1000),
        window_s=STEP_S,
        arrivals=arrivals,
        queue_wait_ms_p50=wait_ms,
        **kw,  # type: ignore[arg-type]
    )


def run(
    policy: ScalingPolicy, replicas: int, start_s: float, end_s: float, make: Callable[[float], PoolSignals]
) -> tuple[int, list[tuple[float, int, int]]]:
    """Drive `policy` every STEP_S from start to end, applying each decision at once; the replicas at the
    end and every change as (t_s, from, to)."""
    changes = []
    t = start_s
    while t < end_s:
        d = policy.decide(make(t), replicas)
        if d.desired_replicas != replicas:
            changes.append((t, replicas, d.desired_replicas))
            replicas = d.desired_replicas
        t += STEP_S
    return replicas, changes
