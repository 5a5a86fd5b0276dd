"""A tidal day in virtual time: the real scheduler core and the real autoscaler policies on modelled workers.

Arrivals go to `SchedulerCore` (a pipeline YAML, filters, queues); every 5 s the
scheduler's own `PoolStatsRecorder` turns what happened into a PoolStats, the autoscaler's
`FleetTable` turns that into PoolSignals, and the pool's policy (threshold or predictive, built
from the same YAML-validated parameters) decides. Workers are modelled at request level from
the sim engine's step-time profile: a worker starts, spends its cold start warming (GPU time,
no service), serves up to `slots` requests at once (first token after its prefill step, then one
decode step per token whose duration grows with the batch), and on scale-down drains (no new
work, finishes what it holds) before its GPU time ends.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmbus.contract.messages import OutcomeStatus, WorkerState, WorkerStatus
from llmbus.contract.request_key import request_key
from llmbus_services.autoscaler.core import FleetTable, ScalingPolicy
from llmbus_services.engine_worker.adapters.engines.sim.profiles import SimProfile
from llmbus_services.scheduler.adapters.pool_stats import PoolStatsRecorder
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.scheduler import CoreConfig, FinalError, PlaceAction, SchedulerCore
from llmbus_services.scheduler.core.types import SchedRequest

POOL = "llama-large"


@dataclass(frozen=True)
class Arrival:
    at_ms: float
    prompt_tokens: int
    output_tokens: int


@dataclass
class WorkerModel:
    worker_id: str
    started_ms: float
    ready_ms: float
    state: WorkerState = WorkerState.WARMING
    running: int = 0
    served: int = 0
    stopped_ms: float | None = None


@dataclass
class ReplayConfig:
    slots: int = 8  # max_num_seqs
    cold_start_s: float = 60.0
    stats_interval_s: float = 5.0
    heartbeat_s: float = 30.0  # gauges only: the scheduler counts its own placements; state changes are sent at once
    ttft_slo_ms: float = 2000.0
    # The batch limit and least-loaded placement (bench/autoscaler_pipeline.yaml): identical workers
    # without a modelled prefix cache leave the default pipeline's affinity scorers nothing to do.
    pipeline: str = str(Path(__file__).resolve().parent / "autoscaler_pipeline.yaml")
    # Identical requests on identical workers: one refused placement means every slot is busy, so a
    # release stops at the first miss instead of trying 8 more queued requests that cannot fit either.
    release_max_misses: int = 1
    start_replicas: int = 1


@dataclass
class DayResult:
    ttft_ms: list[float] = field(default_factory=list)
    unserved: int = 0
    gpu_hours: float = 0.0
    cold_start_gpu_hours: float = 0.0
    never_served_workers: int = 0
    scale_events: int = 0
    workers_started: int = 0
    timeline: list[tuple[float, int, float, float]] = field(default_factory=list)  # t_s, replicas, rate, wait p50
    decisions: list[dict] = field(default_factory=list)


def replay_day(
    arrivals: list[Arrival],
    profile: SimProfile,
    cfg: ReplayConfig,
    policy: ScalingPolicy | None,
    static_replicas: int = 0,
    day_ms: float = 86_400_000.0,
    progress: Callable[[float, int], None] | None = None,
) -> DayResult:
    """One day; `policy` None means `static_replicas` workers all day, ready from the start.
    `progress(t_s, replicas)` is called once per simulated hour."""
    core = SchedulerCore(
        Pipeline.load(cfg.pipeline),
        CoreConfig(
            max_queued_per_model=10**9,
            max_wait_ms=10**12,
            heartbeat_timeout_ms=10**12,
            seed=0,
            release_max_misses=cfg.release_max_misses,
        ),
    )
    recorder = PoolStatsRecorder("replay")
    fleet = FleetTable(stale_ms=10**12)
    res = DayResult()
    workers: dict[str, WorkerModel] = {}
    by_id: dict[str, Arrival] = {}
    arrived: dict[str, float] = {}
    events: list[tuple[float, int, str, str]] = []
    seq = itertools.count()
    ids = itertools.count(1)

    def push(t_ms: float, kind: str, arg: str = "") -> None:
        heapq.heappush(events, (t_ms, next(seq), kind, arg))

    def heartbeat(w: WorkerModel, now: float) -> None:
        status = WorkerStatus(
            worker_id=w.worker_id,
            node_id=w.worker_id,
            state=w.state,
            engine="sim",
            models=[POOL],
            max_model_len=1_000_000,
            max_num_seqs=cfg.slots,
            num_requests_running=w.running,
            cold_start_s=cfg.cold_start_s if w.state != WorkerState.WARMING else None,
            started_at_ms=int(w.started_ms),
            sent_at_ms=int(now),
        )
        fleet.on_status(status)
        apply(core.on_heartbeat(status, int(now)), now)

    def start_worker(now: float, warm: bool) -> None:
        w = WorkerModel(f"w{next(ids)}", now, now if warm else now + cfg.cold_start_s * 1000)
        workers[w.worker_id] = w
        res.workers_started += 1
        if warm:
            w.state = WorkerState.READY
        else:
            push(w.ready_ms, "ready", w.worker_id)
        heartbeat(w, now)

    def stop_worker(w: WorkerModel, now: float) -> None:
        if w.state == WorkerState.WARMING:  # not ready yet: nothing to drain
            finish_worker(w, now)
            return
        w.state = WorkerState.DRAINING
        heartbeat(w, now)
        if w.running == 0:
            finish_worker(w, now)

    def finish_worker(w: WorkerModel, now: float) -> None:
        w.state = WorkerState.STOPPED
        w.stopped_ms = now
        heartbeat(w, now)

    def live() -> list[WorkerModel]:
        return [w for w in workers.values() if w.state in (WorkerState.WARMING, WorkerState.READY)]

    def apply(actions: list, now: float) -> None:
        for a in actions:
            if isinstance(a, FinalError):
                res.unserved += 1
                continue
            assert isinstance(a, PlaceAction)
            p = a.placement
            recorder.on_placed(p, int(arrived[p.request_id]), int(now))
            r = by_id[p.request_id]
            w = workers[p.worker_id]
            w.running += 1
            w.served += 1
            prefill_ms = profile.step_us(r.prompt_tokens, w.running - 1) / 1000
            decode_step_ms = profile.step_us(0, w.running) / 1000
            res.ttft_ms.append(now + prefill_ms - arrived[p.request_id])
            push(now + prefill_ms + decode_step_ms * max(0, r.output_tokens - 1), "finish", p.request_id)

    def scale_to(replicas: int, now: float) -> None:
        current = live()
        for _ in range(replicas - len(current)):
            start_worker(now, warm=False)
        surplus = len(current) - replicas
        # Cancel cold starts first, then drain the emptiest workers.
        for w in sorted(current, key=lambda w: (w.state != WorkerState.WARMING, w.running))[: max(0, surplus)]:
            stop_worker(w, now)

    for i, r in enumerate(arrivals):
        by_id[f"r{i}"] = r
        push(r.at_ms, "arrival", f"r{i}")
    for _ in range(static_replicas if policy is None else cfg.start_replicas):
        start_worker(0.0, warm=True)
    push(cfg.heartbeat_s * 1000, "heartbeat")
    push(cfg.stats_interval_s * 1000, "stats")
    recorder.snapshot(core, 0)

    while events:
        now, _, kind, arg = heapq.heappop(events)
        if now > day_ms and kind in ("heartbeat", "stats"):
            continue
        if kind == "arrival":
            r = by_id[arg]
            arrived[arg] = now
            recorder.on_arrival(POOL, int(now))
            apply(
                core.submit(
                    SchedRequest(arg, POOL, r.prompt_tokens, r.output_tokens, arrived_at_ms=int(now) or 1), int(now)
                ),
                now,
            )
        elif kind == "finish":
            placement = core.fleet.placement_of(request_key("default", arg))  # the tenant SchedRequest defaults to
            assert placement is not None
            recorder.on_outcome(placement, int(now))
            w = workers[placement.worker_id]
            w.running -= 1
            apply(
                core.on_outcome(placement.request_key, placement.attempt, OutcomeStatus.COMPLETED, None, int(now)), now
            )
            if w.state == WorkerState.DRAINING and w.running == 0:
                finish_worker(w, now)
        elif kind == "ready":
            w = workers[arg]
            if w.state == WorkerState.WARMING:
                w.state = WorkerState.READY
                heartbeat(w, now)
        elif kind == "heartbeat":
            for w in list(workers.values()):
                if w.state != WorkerState.STOPPED:
                    heartbeat(w, now)
            push(now + cfg.heartbeat_s * 1000, "heartbeat")
        elif kind == "stats":
            for stats in recorder.snapshot(core, int(now)):
                signals = fleet.signals(stats, int(now))
                current = len(live())
                if policy is not None:
                    decision = policy.decide(signals, current)
                    if decision.desired_replicas != current:
                        res.scale_events += 1
                        res.decisions.append(
                            {
                                "t_s": round(now / 1000),
                                "from": current,
                                "to": decision.desired_replicas,
                                "reason": decision.reason,
                            }
                        )
                        scale_to(decision.desired_replicas, now)
                res.timeline.append((now / 1000, len(live()), signals.arrival_rate_per_s, signals.queue_wait_ms))
            if progress is not None and int(now) % 3_600_000 < cfg.stats_interval_s * 1000:
                progress(now / 1000, len(live()))
            push(now + cfg.stats_interval_s * 1000, "stats")
    end = max(day_ms, now)
    for w in workers.values():
        stopped = w.stopped_ms if w.stopped_ms is not None else end
        res.gpu_hours += (stopped - w.started_ms) / 3.6e6
        res.cold_start_gpu_hours += (min(w.ready_ms, stopped) - w.started_ms) / 3.6e6
        res.never_served_workers += int(w.served == 0)
    res.unserved = len(arrivals) - len(res.ttft_ms)  # answered with an error or never placed
    return res
