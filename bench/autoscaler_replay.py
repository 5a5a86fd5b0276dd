"""A day in virtual time: the real scheduler core and the real autoscaler policies on modelled engines.

Arrivals go to `SchedulerCore` (a pipeline YAML, filters, queues); every 5 s each worker
heartbeats (its engine's gauges: running, waiting, prefill backlog, KV use), the scheduler's own
`PoolStatsRecorder` turns what happened into a PoolStats, the autoscaler's `FleetTable` turns
that into PoolSignals, and the pool's policy decides. Each worker runs `FastEngine`
(bench/autoscaler_engine.py): SimCore's continuous batching with the sim profile's step times,
fast-forwarded over runs of alike decode steps, so a request placed on a busy worker waits inside
the engine behind other prompts' prefill exactly as it would in SimCore. A worker starts, spends
its cold start warming (GPU time, no service), and on scale-down drains (no new work, finishes
what it holds) before its GPU time ends. TTFT is the scheduler's arrival → the engine's first
token; each finished request's TTFT and time per output token reach the recorder on its outcome,
as the worker's DispatchOutcome carries them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.autoscaler_engine import EngineRequest, FastEngine
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
    engine: FastEngine
    state: WorkerState = WorkerState.WARMING
    served: int = 0
    stopped_ms: float | None = None
    version: int = 0  # bumped when its engine's segment changes: older segment events are stale


@dataclass
class ReplayConfig:
    slots: int = 256  # max_num_seqs
    max_num_batched_tokens: int = 8192
    cold_start_s: float = 120.0
    stats_interval_s: float = 5.0  # also the heartbeat interval: every worker reports just before
    ttft_slo_ms: float = 2000.0
    # Placement by the estimated wait for the first token (prefill placed ahead) and load: the default
    # pipeline's load scorers; the replay models no prefix cache, so its affinity scorers have nothing to do.
    pipeline: str = str(Path(__file__).resolve().parent / "autoscaler_pipeline.yaml")
    start_replicas: int = 1


class GaveUp(Exception):
    """More requests missed the TTFT target than the day may miss: its verdict is known."""


@dataclass
class DayResult:
    ttft_ms: list[float] = field(default_factory=list)
    late: int = 0  # requests over the TTFT target
    gave_up_at_s: float | None = None  # the replay stopped here: more were late than allowed
    unserved: int = 0
    gpu_hours: float = 0.0
    cold_start_gpu_hours: float = 0.0
    never_served_workers: int = 0
    scale_events: int = 0
    workers_started: int = 0
    # t_s, replicas, arrivals/s, queue wait p50 ms, TTFT p99 ms (window), prefill backlog tokens
    timeline: list[tuple[float, int, float, float, float, int]] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)


def replay_day(
    arrivals: list[Arrival],
    profile: SimProfile,
    cfg: ReplayConfig,
    policy: ScalingPolicy | None,
    static_replicas: int = 0,
    day_ms: float = 86_400_000.0,
    progress: Callable[[float, int], None] | None = None,
    give_up_after_late: int | None = None,
) -> DayResult:
    """One day; `policy` None means `static_replicas` workers all day, ready from the start.
    `progress(t_s, replicas)` is called once per simulated hour. With `give_up_after_late`, the
    replay stops once more requests than that have missed the TTFT target (a static fleet that
    fails the day need not be replayed to its end)."""
    core = SchedulerCore(
        Pipeline.load(cfg.pipeline),
        CoreConfig(
            max_queued_per_model=10**9,
            max_wait_ms=10**12,
            heartbeat_timeout_ms=10**12,
            seed=0,
            release_max_misses=1,  # identical workers: one refused placement means every slot is busy
            prefill_tokens_per_s=1e6 / profile.prefill_us_per_token,
        ),
    )
    recorder = PoolStatsRecorder("replay")
    fleet = FleetTable(stale_ms=10**12)
    res = DayResult()
    gpus = profile.tensor_parallel_size
    workers: dict[str, WorkerModel] = {}
    by_id: dict[str, Arrival] = {}
    arrived: dict[str, float] = {}
    events: list[tuple[float, int, str, str, int]] = []
    seq = itertools.count()
    ids = itertools.count(1)

    def push(t_ms: float, kind: str, arg: str = "", version: int = 0) -> None:
        heapq.heappush(events, (t_ms, next(seq), kind, arg, version))

    def schedule_segment(w: WorkerModel) -> None:
        w.version += 1
        if w.engine.busy:
            push(w.engine.segment_end_us / 1000, "segment", w.worker_id, w.version)

    def heartbeat(w: WorkerModel, now: float) -> None:
        engine = w.engine
        kv_blocks_total = profile.kv_blocks_total
        kv_blocks_used = min(kv_blocks_total, -(-engine.kv_tokens() // profile.kv_block_size))
        status = WorkerStatus(
            worker_id=w.worker_id,
            node_id=w.worker_id,
            state=w.state,
            engine="sim",
            models=[POOL],
            max_model_len=1_000_000,
            max_num_seqs=cfg.slots,
            kv_block_size=profile.kv_block_size,
            kv_blocks_total=kv_blocks_total,
            kv_blocks_free=kv_blocks_total - kv_blocks_used,
            kv_cache_usage_perc=kv_blocks_used / kv_blocks_total,
            num_requests_running=engine.running,
            num_requests_waiting=len(engine.waiting),
            prefill_backlog_tokens=engine.prefill_backlog_tokens(),
            cold_start_s=cfg.cold_start_s if w.state != WorkerState.WARMING else None,
            started_at_ms=int(w.started_ms),
            sent_at_ms=int(now),
        )
        fleet.on_status(status)
        apply(core.on_heartbeat(status, int(now)), now)

    def start_worker(now: float, warm: bool) -> None:
        engine = FastEngine(profile, cfg.slots, cfg.max_num_batched_tokens)
        w = WorkerModel(f"w{next(ids)}", now, now if warm else now + cfg.cold_start_s * 1000, engine)
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
        if not w.engine.busy:
            finish_worker(w, now)

    def finish_worker(w: WorkerModel, now: float) -> None:
        w.state = WorkerState.STOPPED
        w.stopped_ms = now
        heartbeat(w, now)

    def live() -> list[WorkerModel]:
        return [w for w in workers.values() if w.state in (WorkerState.WARMING, WorkerState.READY)]

    def apply(actions: list, now: float) -> None:
        touched: set[str] = set()
        for a in actions:
            if isinstance(a, FinalError):
                res.unserved += 1
                continue
            assert isinstance(a, PlaceAction)
            p = a.placement
            recorder.on_placed(p, int(arrived[p.request_id]), int(now))
            r = by_id[p.request_id]
            w = workers[p.worker_id]
            w.served += 1
            w.engine.add(EngineRequest(p.request_id, r.prompt_tokens, r.output_tokens), now * 1000)
            touched.add(w.worker_id)
        for worker_id in touched:
            schedule_segment(workers[worker_id])

    def finished(w: WorkerModel, request: EngineRequest, now: float) -> None:
        placement = core.fleet.placement_of(request_key("default", request.request_id))
        assert placement is not None and request.first_token_us is not None
        ttft_ms = request.first_token_us / 1000 - arrived[request.request_id]
        res.ttft_ms.append(ttft_ms)
        if ttft_ms > cfg.ttft_slo_ms:
            res.late += 1
            if give_up_after_late is not None and res.late > give_up_after_late:
                raise GaveUp
        outputs = request.output_tokens
        tpot_ms = (now - request.first_token_us / 1000) / (outputs - 1) if outputs > 1 else None
        recorder.on_finished(placement, int(now), outputs, ttft_ms, tpot_ms)  # what its DispatchOutcome carries
        apply(core.on_outcome(placement.request_key, placement.attempt, OutcomeStatus.COMPLETED, None, int(now)), now)

    def scale_to(replicas: int, now: float) -> None:
        current = live()
        for _ in range(replicas - len(current)):
            start_worker(now, warm=False)
        surplus = len(current) - replicas
        # Cancel cold starts first, then drain the emptiest workers.
        for w in sorted(current, key=lambda w: (w.state != WorkerState.WARMING, w.engine.running))[: max(0, surplus)]:
            stop_worker(w, now)

    def stats_tick(now: float) -> None:
        for w in list(workers.values()):
            if w.state != WorkerState.STOPPED:
                heartbeat(w, now)
        for stats in recorder.snapshot(core, int(now)):
            signals = fleet.signals(stats, int(now))
            current = len(live())
            if policy is not None:
                decision = policy.decide(signals, current)
                if decision.desired_replicas != current:
                    res.scale_events += 1
                    res.decisions.append(
                        {"t_s": round(now / 1000), "from": current, "to": decision.desired_replicas}
                        | {"reason": decision.reason}
                    )
                    scale_to(decision.desired_replicas, now)
            res.timeline.append(
                (
                    now / 1000,
                    len(live()),
                    signals.arrival_rate_per_s,
                    signals.queue_wait_ms,
                    signals.ttft_ms_p99 or 0.0,
                    signals.prefill_backlog_tokens,
                )
            )

    def step(event: tuple[float, int, str, str, int]) -> float:
        now, _, kind, arg, version = event
        clock[0] = now
        if kind == "segment":
            w = workers[arg]
            if version != w.version:
                return now  # the segment was cut short by an arrival
            out = w.engine.advance()
            for request in out.finished:
                finished(w, request, now)
            schedule_segment(w)
            if w.state == WorkerState.DRAINING and not w.engine.busy:
                finish_worker(w, now)
        elif kind == "arrival":
            r = by_id[arg]
            arrived[arg] = now
            recorder.on_arrival(POOL, int(now), prompt_tokens=r.prompt_tokens)
            routed = SchedRequest(arg, POOL, r.prompt_tokens, r.output_tokens, arrived_at_ms=int(now) or 1)
            apply(core.submit(routed, int(now)), now)
        elif kind == "ready":
            w = workers[arg]
            if w.state == WorkerState.WARMING:
                w.state = WorkerState.READY
                heartbeat(w, now)
        elif kind == "stats":
            if now > day_ms:
                return now
            stats_tick(now)
            if progress is not None and int(now) % 3_600_000 < cfg.stats_interval_s * 1000:
                progress(now / 1000, len(live()))
            push(now + cfg.stats_interval_s * 1000, "stats")
        return now

    for i, r in enumerate(arrivals):
        by_id[f"r{i}"] = r
        push(r.at_ms, "arrival", f"r{i}")
    for _ in range(static_replicas if policy is None else cfg.start_replicas):
        start_worker(0.0, warm=True)
    push(cfg.stats_interval_s * 1000, "stats")
    recorder.snapshot(core, 0)

    clock = [0.0]  # the event being handled (ms)
    try:
        while events:
            step(heapq.heappop(events))
    except GaveUp:
        res.gave_up_at_s = clock[0] / 1000
        return res
    end = max(day_ms, clock[0])
    for w in workers.values():
        stopped = w.stopped_ms if w.stopped_ms is not None else end
        res.gpu_hours += gpus * (stopped - w.started_ms) / 3.6e6
        res.cold_start_gpu_hours += gpus * (min(w.ready_ms, stopped) - w.started_ms) / 3.6e6
        res.never_served_workers += int(w.served == 0)
    res.unserved = len(arrivals) - len(res.ttft_ms)  # answered with an error or never placed
    return res
