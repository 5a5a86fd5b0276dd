"""Replay a request trace through one SimCore in virtual time and measure what clients would see."""

from __future__ import annotations

import csv
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from bench.traces import AZURE_CONVERSATION
from llmbus_services.engine_worker.adapters.engines.sim.core import SimCore, SimRequest, StepResult

AZURE_CONV_TRACE = AZURE_CONVERSATION


@dataclass(frozen=True)
class TraceRequest:
    arrival_us: float
    prompt_tokens: int
    output_tokens: int


def load_azure_trace(path: Path = AZURE_CONV_TRACE, window_s: float = 600.0) -> list[TraceRequest]:
    """Rows of the Azure LLM trace (TIMESTAMP, ContextTokens, GeneratedTokens) in the first `window_s`."""
    out: list[TraceRequest] = []
    t0: datetime | None = None
    with path.open() as f:
        for row in csv.DictReader(f):
            # Timestamps carry 7 fractional digits; datetime takes 6.
            ts = datetime.fromisoformat(row["TIMESTAMP"][:26])
            t0 = t0 or ts
            offset_s = (ts - t0).total_seconds()
            if offset_s >= window_s:
                break
            out.append(
                TraceRequest(offset_s * 1e6, max(1, int(row["ContextTokens"])), max(1, int(row["GeneratedTokens"])))
            )
    return out


@dataclass
class ReplayResult:
    requests: int = 0
    skipped: int = 0  # refused by the engine (longer than max_model_len)
    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)  # per request with ≥ 2 output tokens
    e2e_ms: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    makespan_s: float = 0.0  # virtual: first arrival to last token
    steps: int = 0
    preemptions: int = 0
    prefix_cache_hit_rate: float = 0.0
    kv_usage_mean: float = 0.0  # weighted by step duration
    kv_usage_max: float = 0.0
    running_mean: float = 0.0
    waiting_max: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of this process: less sensitive than wall time to a busy machine
    timeline: list[tuple[float, float, int, int]] = field(default_factory=list)  # (t_s, kv usage, running, waiting)

    def summary(self) -> dict[str, float | int]:
        def pct(values: list[float], q: float) -> float:
            return round(float(np.percentile(values, q)), 2) if values else float("nan")

        return {
            "requests": self.requests,
            "skipped": self.skipped,
            "ttft_ms_p50": pct(self.ttft_ms, 50),
            "ttft_ms_p90": pct(self.ttft_ms, 90),
            "ttft_ms_p99": pct(self.ttft_ms, 99),
            "tpot_ms_p50": pct(self.tpot_ms, 50),
            "tpot_ms_p90": pct(self.tpot_ms, 90),
            "e2e_ms_p50": pct(self.e2e_ms, 50),
            "e2e_ms_p99": pct(self.e2e_ms, 99),
            "output_tokens_per_s": round(self.output_tokens / self.makespan_s, 1) if self.makespan_s else 0.0,
            "total_tokens_per_s": round((self.prompt_tokens + self.output_tokens) / self.makespan_s, 1)
            if self.makespan_s
            else 0.0,
            "requests_per_s": round(self.requests / self.makespan_s, 3) if self.makespan_s else 0.0,
            "makespan_s": round(self.makespan_s, 2),
            "steps": self.steps,
            "preemptions": self.preemptions,
            "prefix_cache_hit_rate": round(self.prefix_cache_hit_rate, 4),
            "kv_usage_mean": round(self.kv_usage_mean, 4),
            "kv_usage_max": round(self.kv_usage_max, 4),
            "running_mean": round(self.running_mean, 1),
            "waiting_max": self.waiting_max,
            "wall_s": round(self.wall_s, 3),
            "cpu_s": round(self.cpu_s, 3),
        }


def replay(
    core: SimCore,
    trace: list[TraceRequest],
    *,
    time_scale: float = 1.0,
    timeline_every_s: float = 1.0,
    progress: Callable[[float], None] | None = None,
) -> ReplayResult:
    """Feed `trace` to `core` at its arrival times (divided by `time_scale`) and run to the end.

    Requests arriving while a step runs join the next step, as in a real engine. The
    measured wall time covers the stepping and bookkeeping, not the trace parsing.
    """
    res = ResultBuilder(core, timeline_every_s)
    arrivals = [(t.arrival_us / time_scale, t) for t in trace]
    next_i = 0
    n = len(arrivals)
    wall_t0 = time.perf_counter()
    cpu_t0 = time.process_time()
    next_progress = 0.1
    while next_i < n or core.has_work():
        while next_i < n and arrivals[next_i][0] <= core.now_us:
            t_us, req = arrivals[next_i]
            res.arrive(f"t{next_i}", t_us, req)
            next_i += 1
        if not core.has_work():
            core.advance_to(arrivals[next_i][0])
            continue
        res.record(core.step())
        if progress is not None and next_i / n >= next_progress:
            progress(next_i / n)
            next_progress += 0.1
    res.result.wall_s = time.perf_counter() - wall_t0
    res.result.cpu_s = time.process_time() - cpu_t0
    return res.finish()


class ResultBuilder:
    def __init__(self, core: SimCore, timeline_every_s: float) -> None:
        self.core = core
        self.result = ReplayResult()
        self.arrival_us: dict[str, float] = {}
        self.first_us: dict[str, float] = {}
        self.first_arrival_us: float | None = None
        self.kv_weighted = 0.0
        self.running_weighted = 0.0
        self.busy_us = 0.0
        self.timeline_every_us = timeline_every_s * 1e6
        self.next_timeline_us = 0.0

    def arrive(self, request_id: str, t_us: float, req: TraceRequest) -> None:
        if self.first_arrival_us is None:
            self.first_arrival_us = t_us
        if self.core.refusal(req.prompt_tokens, req.output_tokens) is not None:
            self.result.skipped += 1
            return
        self.core.add(SimRequest(request_id, req.prompt_tokens, req.output_tokens), arrival_us=t_us)
        self.arrival_us[request_id] = t_us
        self.result.requests += 1

    def record(self, step: StepResult) -> None:
        res = self.result
        end_us = step.start_us + step.duration_us
        self.kv_weighted += step.kv_usage * step.duration_us
        self.running_weighted += step.num_running * step.duration_us
        self.busy_us += step.duration_us
        res.kv_usage_max = max(res.kv_usage_max, step.kv_usage)
        res.waiting_max = max(res.waiting_max, step.num_waiting)
        if end_us >= self.next_timeline_us:
            res.timeline.append((end_us / 1e6, step.kv_usage, step.num_running, step.num_waiting))
            self.next_timeline_us = end_us + self.timeline_every_us
        for out in step.outputs:
            rid = out.request_id
            if out.completion_tokens == 1:
                self.first_us[rid] = end_us
                res.ttft_ms.append((end_us - self.arrival_us[rid]) / 1e3)
            if out.finished:
                first_us = self.first_us.pop(rid)
                arrival_us = self.arrival_us.pop(rid)
                res.e2e_ms.append((end_us - arrival_us) / 1e3)
                if out.completion_tokens > 1:
                    res.tpot_ms.append((end_us - first_us) / 1e3 / (out.completion_tokens - 1))
                res.prompt_tokens += out.prompt_tokens
                res.output_tokens += out.completion_tokens
                res.makespan_s = (end_us - (self.first_arrival_us or 0.0)) / 1e6

    def finish(self) -> ReplayResult:
        core, res = self.core, self.result
        res.steps = core.steps_total
        res.preemptions = core.preemptions_total
        if core.prefix_cache_queries_total:
            res.prefix_cache_hit_rate = core.prefix_cache_hits_total / core.prefix_cache_queries_total
        if self.busy_us:
            res.kv_usage_mean = self.kv_weighted / self.busy_us
            res.running_mean = self.running_weighted / self.busy_us
        return res
