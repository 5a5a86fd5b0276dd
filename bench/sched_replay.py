"""Discrete-event replay of a request trace through the scheduler's real policy onto SimCore workers.

Virtual time only: N `SimCore` engines (the sim engine's pure core, calibrated step times,
paged KV with prefix caching) are driven by the very `SchedulerCore` the service runs
(same pipeline YAML, plugins, flow queue, recovery). Heartbeats carry SimCore's gauges at
a fixed virtual interval; completions reach the scheduler as outcomes at the step's end.
No broker, no asyncio: a 12k-request trace replays in seconds, not hours.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from llmbus.contract.messages import OutcomeStatus, WorkerState, WorkerStatus
from llmbus.contract.request_key import request_key
from llmbus.tokens import CHARS_PER_TOKEN, prefix_block_hashes
from llmbus_services.engine_worker.adapters.engines.sim.core import SimCore, SimRequest
from llmbus_services.engine_worker.adapters.engines.sim.profiles import SimProfile
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.scheduler import CoreConfig, FinalError, PlaceAction, SchedulerCore
from llmbus_services.scheduler.core.types import SchedRequest

TRACE_BLOCK_TOKENS = 512  # Mooncake: one hash id per 512-token block
MODEL = "llama-3.1-8b"


@dataclass(frozen=True)
class TraceRequest:
    request_id: str
    arrival_ms: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    block_hashes: tuple[str, ...]  # chained 16-token hashes of the prompt text built from hash_ids


def prompt_text(input_tokens: int, hash_ids: tuple[int, ...]) -> str:
    """Prompt whose k-th 512-token block is a pure function of hash_ids[k] (equal ids → equal text)."""
    block_chars = TRACE_BLOCK_TOKENS * CHARS_PER_TOKEN
    parts = []
    for h in hash_ids:
        unit = f"{h:07d}|"  # 8 characters = 2 pseudo-tokens; 256 copies fill a block
        parts.append(unit * (block_chars // len(unit)))
    text = "".join(parts)
    return text[: input_tokens * CHARS_PER_TOKEN]


def load_trace(rows: list[dict], block_tokens: int) -> list[TraceRequest]:
    out = []
    for i, row in enumerate(rows):
        ids = tuple(row["hash_ids"])
        text = prompt_text(row["input_length"], ids)
        out.append(
            TraceRequest(
                f"req-{i}",
                float(row["timestamp"]),
                row["input_length"],
                max(1, row["output_length"]),
                ids,
                tuple(prefix_block_hashes(text, block_tokens)),
            )
        )
    return out


def reuse_ceiling(trace: list[TraceRequest]) -> dict[str, float]:
    """What an unbounded, shared cache could reuse: share of 512-blocks seen before, and of prompt tokens."""
    seen: set[int] = set()
    blocks = reused_blocks = 0
    prompt_tokens = cacheable_tokens = 0
    for r in trace:
        run = 0
        leading = True
        for h in r.hash_ids:
            blocks += 1
            if h in seen:
                reused_blocks += 1
                run += leading
            else:
                leading = False
            seen.add(h)
        prompt_tokens += r.prompt_tokens
        cacheable_tokens += min(run * TRACE_BLOCK_TOKENS, r.prompt_tokens - 1)
    return {"block_reuse": reused_blocks / blocks, "prefix_token_reuse": cacheable_tokens / prompt_tokens}


@dataclass
class ReplayResult:
    ttft_ms: list[float] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    host_loaded_tokens: int = 0  # of the cached ones, loaded from the host KV tier
    makespan_ms: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    per_worker_busy_ms: dict[str, float] = field(default_factory=dict)
    per_worker_requests: dict[str, int] = field(default_factory=dict)
    per_worker_tokens: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    scheduler_queued: int = 0


@dataclass
class ReplayConfig:
    workers: int = 4
    time_scale: float = 1.0  # arrival times are divided by this (higher = more load)
    heartbeat_ms: float = 500.0
    tick_ms: float = 100.0
    max_model_len: int = 131_072
    max_num_seqs: int = 256
    seed: int = 0
    kv_blocks_total: int | None = None  # None: the profile's (one GPU's HBM)
    host_kv_blocks: int = 0  # per worker: a host-memory KV tier (vLLM's native CPU offloading); 0: none


def replay(trace: list[TraceRequest], pipeline_name: str, profile: SimProfile, cfg: ReplayConfig) -> ReplayResult:
    sched = SchedulerCore(
        Pipeline.load(pipeline_name),
        CoreConfig(
            seed=cfg.seed,
            max_queued_per_model=10**9,
            max_wait_ms=10**12,
            heartbeat_timeout_ms=10**12,
            prefill_tokens_per_s=1e6 / profile.prefill_us_per_token,
        ),
    )
    engines = {
        f"w{i}": SimCore(
            profile,
            kv_blocks_total=cfg.kv_blocks_total,
            max_num_seqs=cfg.max_num_seqs,
            max_model_len=cfg.max_model_len,
            host_kv_blocks=cfg.host_kv_blocks,
        )
        for i in range(cfg.workers)
    }
    res = ReplayResult(
        per_worker_busy_ms=dict.fromkeys(engines, 0.0),
        per_worker_requests=dict.fromkeys(engines, 0),
        per_worker_tokens=dict.fromkeys(engines, 0),
    )
    by_id = {r.request_id: r for r in trace}
    arrival_ms: dict[str, float] = {}
    placed_attempt: dict[str, int] = {}
    first_token_seen: set[str] = set()
    stepping: set[str] = set()

    events: list[tuple[float, int, str, str]] = []  # (time ms, seq, kind, arg)
    seq = itertools.count()

    def push(t_ms: float, kind: str, arg: str = "") -> None:
        heapq.heappush(events, (t_ms, next(seq), kind, arg))

    def heartbeat(worker_id: str, now_ms: float) -> WorkerStatus:
        e = engines[worker_id]
        return WorkerStatus(
            worker_id=worker_id,
            node_id=worker_id,
            state=WorkerState.READY,
            engine="sim",
            models=[MODEL],
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            kv_block_size=e.block_size,
            kv_blocks_total=e.pool.num_blocks,
            kv_blocks_free=e.pool.num_free,
            kv_offload_blocks_total=e.host.num_blocks if e.host is not None else 0,
            kv_cache_usage_perc=min(1.0, e.pool.usage()),
            num_requests_running=len(e.running),
            num_requests_waiting=len(e.waiting) + len(e.loading),
            started_at_ms=0,  # one process per worker all the replay long (a later start would be a restart)
            sent_at_ms=int(now_ms),
        )

    def start_step(worker_id: str, now_ms: float) -> None:
        e = engines[worker_id]
        e.advance_to(now_ms * 1000)
        step = e.step()
        res.per_worker_busy_ms[worker_id] += step.duration_us / 1000
        stepping.add(worker_id)
        push(step.end_us / 1000, "step_end", worker_id)
        pending_outputs[worker_id] = step

    pending_outputs: dict = {}

    def apply(actions: list, now_ms: float) -> None:
        nonlocal remaining
        for a in actions:
            if isinstance(a, FinalError):
                res.errors[a.error.code.value] = res.errors.get(a.error.code.value, 0) + 1
                remaining -= 1  # a final answer too: the request is done
                continue
            assert isinstance(a, PlaceAction)
            p = a.placement
            r = by_id[p.request_id]
            placed_attempt[p.request_id] = p.attempt
            res.per_worker_requests[p.worker_id] += 1
            res.per_worker_tokens[p.worker_id] += r.prompt_tokens + r.output_tokens
            engines[p.worker_id].add(
                SimRequest(p.request_id, r.prompt_tokens, r.output_tokens, r.block_hashes), arrival_us=now_ms * 1000
            )
            if p.worker_id not in stepping:
                start_step(p.worker_id, now_ms)

    for r in trace:
        push(r.arrival_ms / cfg.time_scale, "arrival", r.request_id)
    now_ms = 0.0
    for wid in engines:
        sched.on_heartbeat(heartbeat(wid, 0), 0)
    push(cfg.heartbeat_ms, "heartbeat")
    push(cfg.tick_ms, "tick")
    remaining = len(trace)

    while events and remaining > 0:
        now_ms, _, kind, arg = heapq.heappop(events)
        if kind == "arrival":
            r = by_id[arg]
            arrival_ms[arg] = now_ms
            req = SchedRequest(
                request_id=arg,
                model=MODEL,
                prompt_tokens=r.prompt_tokens,
                max_tokens=r.output_tokens,
                arrived_at_ms=int(now_ms) or 1,
                prefix_block_hashes=list(r.block_hashes),
            )
            actions = sched.submit(req, int(now_ms))
            if not actions:
                res.scheduler_queued += 1
            apply(actions, now_ms)
        elif kind == "step_end":
            stepping.discard(arg)
            step = pending_outputs.pop(arg)
            res.preemptions += len(step.preempted)
            for out in step.outputs:
                if out.request_id not in first_token_seen and out.completion_tokens >= 1:
                    first_token_seen.add(out.request_id)
                    res.ttft_ms.append(now_ms - arrival_ms[out.request_id])
                    res.cached_prompt_tokens += out.cached_prompt_tokens
                    res.host_loaded_tokens += out.host_loaded_tokens
                    res.prompt_tokens += out.prompt_tokens
                res.output_tokens += out.new_tokens
                if out.finished:
                    remaining -= 1
                    res.e2e_ms.append(now_ms - arrival_ms[out.request_id])
                    apply(
                        sched.on_outcome(
                            request_key("default", out.request_id),  # the tenant SchedRequest defaults to
                            placed_attempt[out.request_id],
                            OutcomeStatus.COMPLETED,
                            None,
                            int(now_ms),
                        ),
                        now_ms,
                    )
            if engines[arg].has_work() and arg not in stepping:
                start_step(arg, now_ms)
        elif kind == "heartbeat":
            for wid in engines:
                apply(sched.on_heartbeat(heartbeat(wid, now_ms), int(now_ms)), now_ms)
            push(now_ms + cfg.heartbeat_ms, "heartbeat")
        elif kind == "tick":
            apply(sched.tick(int(now_ms)), now_ms)
            push(now_ms + cfg.tick_ms, "tick")
    res.makespan_ms = now_ms
    return res
