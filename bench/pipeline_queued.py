"""Control-plane queued time of a replay window, from the services' own records, read after it ends.

Queued = received → engine start: the worker's `InferenceResult.timings.queued_ms`, measured
against the router's `received_at_ms` (one machine, one clock). Each request's Dispatch (on
the worker's dispatch topic) splits it by hop: router (received → routed), scheduler
(routed → the Dispatch made, after the placement's claim), worker (Dispatch made → engine
start: the record's trip to the worker, the fence check, admission).

Time the engines had no room is not recorded per request anywhere: when no worker has room by
the scheduler's count (free KV blocks of the last heartbeat minus what it placed since, and
placements not yet finished against max_num_seqs), the scheduler holds the request in its
queue, and that wait is inside the scheduler hop; a worker refusing admission hands it back
(attempt > 1), counted apart. So the figure here is the whole received → engine start, room
waits included: an upper bound of the control plane's. Whether requests waited for room is
shown for the window as a whole: the scheduler's pool statistics (requests it held, every 5 s),
with the worker's heartbeats (its engine's own waiting requests and KV use, once a second) as
context: the engine's own queue comes after engine start, outside the queued time.

The topics are tailed group-less from just before the window and read only after it, so the
measurement adds no work to the services nor to the client while the window runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.settings import BusSettings

QUEUED_P99_TARGET_MS = 100.0
QUEUED_AT_RATE_PER_S = 100.0
HOPS = ("queued", "router", "scheduler", "worker")


def percentiles(values: list[float], qs: tuple[int, ...] = (50, 90, 99), digits: int = 1) -> dict[str, float | None]:
    """Nearest-rank percentiles (the value at rank ceil(q/100·n)), rounded to `digits`; None without values."""
    ordered = sorted(values)
    out: dict[str, float | None] = {}
    for q in qs:
        if not ordered:
            out[f"p{q}"] = None
            continue
        rank = max(1, -(-q * len(ordered) // 100))
        out[f"p{q}"] = round(float(ordered[rank - 1]), digits)
    return out


class WindowRecords:
    """Group-less tails, started before a window, of llm.results, one worker's dispatch topic, the
    workers' heartbeats and the scheduler's pool statistics."""

    def __init__(self, settings: BusSettings, worker_id: str) -> None:
        topics = t.Topics(settings.topic_prefix)
        self.results = TopicTail(settings, topics.name(t.RESULTS))
        self.dispatches = TopicTail(settings, topics.dispatch(worker_id))
        self.heartbeats = TopicTail(settings, topics.name(t.WORKERS))
        self.pool_stats = TopicTail(settings, topics.name(t.POOL_STATS))
        self.tails = (self.results, self.dispatches, self.heartbeats, self.pool_stats)

    async def start(self) -> WindowRecords:
        for tail in self.tails:
            await tail.start()
        return self

    async def stop(self) -> None:
        for tail in self.tails:
            with contextlib.suppress(Exception):
                await tail.stop()

    async def read_status(self, timeout_s: float = 1.0) -> tuple[list[dict], list[dict]]:
        """Every heartbeat and pool statistic written since `start` (all in the log by now)."""
        heartbeats = [json.loads(r.value) async for r in self.heartbeats.records(timeout_s)]  # type: ignore[attr-defined]
        pool_stats = [json.loads(r.value) async for r in self.pool_stats.records(timeout_s)]  # type: ignore[attr-defined]
        return heartbeats, pool_stats

    async def read(
        self, request_ids: set[str], timeout_s: float
    ) -> tuple[dict[str, dict], dict[tuple[str, int], dict]]:
        """The results of `request_ids` and their Dispatches, until all are in or `timeout_s` passes."""
        results: dict[str, dict] = {}
        dispatches: dict[tuple[str, int], dict] = {}
        if not request_ids:
            return results, dispatches
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async for record in self.results.records(timeout_s):
            if (record.key or b"").decode() in request_ids:  # type: ignore[attr-defined]
                result = json.loads(record.value)  # type: ignore[attr-defined]
                if not result.get("shadow"):
                    results[result["request_id"]] = result
            if len(results) >= len(request_ids):
                break
        wanted = {(rid, int(r.get("attempt", 1))) for rid, r in results.items()}
        async for record in self.dispatches.records(max(0.5, deadline - loop.time())):
            if (record.key or b"").decode() in request_ids:  # type: ignore[attr-defined]
                dispatch = json.loads(record.value)  # type: ignore[attr-defined]
                dispatches[(dispatch["routed"]["request"]["request_id"], int(dispatch.get("attempt", 1)))] = dispatch
            if wanted <= dispatches.keys():
                break
        return results, dispatches


def queue_hops(results: dict[str, dict], dispatches: dict[tuple[str, int], dict]) -> dict[str, list[float]]:
    """Per answered request: queued (received → engine start) and its router / scheduler / worker hops.

    Requests without a queued time (cache hits, errors before an engine) are left out; the hops
    of a request come from the Dispatch of the attempt that produced its result.
    """
    hops: dict[str, list[float]] = {name: [] for name in HOPS}
    for rid, result in results.items():
        timings = result.get("timings") or {}
        queued_ms, received_ms = timings.get("queued_ms"), timings.get("received_at_ms")
        if queued_ms is None or received_ms is None:
            continue
        hops["queued"].append(float(queued_ms))
        dispatch = dispatches.get((rid, int(result.get("attempt", 1))))
        if dispatch is None:
            continue
        routed_ms = float(dispatch["routed"]["routed_at_ms"])
        dispatched_ms = float(dispatch["dispatched_at_ms"])
        hops["router"].append(routed_ms - received_ms)
        hops["scheduler"].append(dispatched_ms - routed_ms)
        hops["worker"].append(received_ms + queued_ms - dispatched_ms)
    return hops


def engine_room(heartbeats: list[dict], pool_stats: list[dict], model: str) -> dict[str, object]:
    """Whether requests waited for room over the window.

    A request waits for room in the scheduler's queue (held until a worker has room by its
    count), so the pool statistics' `queued` (requests held, at each snapshot) is what says
    whether queued time holds such waits. The engine's own queue and KV use (its heartbeats)
    are context: a request the engine has not started yet has already left the queued time.
    """
    beats = [h for h in heartbeats if model in h.get("models", [model])]
    pools = [p for p in pool_stats if p.get("pool") == model]
    held = max((int(p.get("queued", 0)) for p in pools), default=None)
    kv_use = max((float(h.get("kv_cache_usage_perc", 0.0)) for h in beats), default=None)
    if held is None:
        verdict = "no pool statistics read"
    elif held == 0:
        verdict = f"the scheduler held none at its {len(pools)} snapshot(s)"
    else:
        verdict = f"the scheduler held up to {held} waiting for room: part of its hop is that wait"
    return {
        "pool_stats": len(pools),
        "scheduler_held_max": held,
        "scheduler_oldest_wait_ms_max": max((float(p.get("oldest_wait_ms", 0.0)) for p in pools), default=None),
        "heartbeats": len(beats),
        "engine_waiting_max": max((int(h.get("num_requests_waiting", 0)) for h in beats), default=None),
        "engine_running_max": max((int(h.get("num_requests_running", 0)) for h in beats), default=None),
        "max_num_seqs": max((int(h.get("max_num_seqs", 0)) for h in beats), default=0),
        "kv_cache_usage_max": round(kv_use, 3) if kv_use is not None else None,
        "verdict": verdict,
    }


def summarise_queued(
    results: dict[str, dict], dispatches: dict[tuple[str, int], dict], sent: int, rate_per_s: float
) -> dict[str, object]:
    """Percentiles of the queued time and its hops, and the issue's target: p99 ≤ 100 ms at ≥ 100/s."""
    hops = queue_hops(results, dispatches)
    queued_p99 = percentiles(hops["queued"])["p99"]
    at_rate = rate_per_s >= QUEUED_AT_RATE_PER_S
    if queued_p99 is None:
        verdict = "no queued times read"
    elif queued_p99 <= QUEUED_P99_TARGET_MS:
        verdict = "met" if at_rate else f"within 100 ms, but at {rate_per_s:g}/s (target rate 100/s)"
    else:
        verdict = f"missed by {queued_p99 - QUEUED_P99_TARGET_MS:.1f} ms" + (
            "" if at_rate else f" (at {rate_per_s:g}/s)"
        )
    return {
        "sent": sent,
        "results_read": len(results),
        "with_queued_time": len(hops["queued"]),
        "with_dispatch": len(hops["router"]),
        "retried": sum(1 for r in results.values() if int(r.get("attempt", 1)) > 1),
        **{f"{name}_ms": percentiles(values) for name, values in hops.items()},
        "target": f"p99 ≤ {QUEUED_P99_TARGET_MS:g} ms at ≥ {QUEUED_AT_RATE_PER_S:g}/s",
        "verdict": verdict,
    }
