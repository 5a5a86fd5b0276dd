"""The replay's fast-forwarded engine (bench/autoscaler_engine.py) against SimCore, step for step.

Same profile, same batch limits, no prefix cache, a KV cache that never fills: every request's
first token and last token must come at the same instant from both, whatever the arrivals —
prefill-heavy bursts (chunked prefill across steps, a full batch) and long decodes alike.
"""

from __future__ import annotations

import heapq
import random

import pytest

from bench.autoscaler_engine import EngineRequest, FastEngine
from llmbus_services.engine_worker.adapters.engines.sim.core import SimCore, SimRequest
from llmbus_services.engine_worker.adapters.engines.sim.profiles import get_profile

PROFILE = get_profile("llama-3.3-70b-h100-tp4")


def workload(seed: int, n: int, mean_gap_us: float, prompt: tuple[int, int], output: tuple[int, int]):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        # bursts: a tenth of the gaps are 50x shorter
        t += rng.expovariate(1 / mean_gap_us) * (0.02 if rng.random() < 0.1 else 1.0)
        out.append((t, f"r{i}", rng.randint(*prompt), rng.randint(*output)))
    return out


def simcore_times(arrivals, max_num_seqs: int, budget: int) -> dict[str, tuple[float, float]]:  # type: ignore[no-untyped-def]
    core = SimCore(
        PROFILE,
        kv_blocks_total=10**7,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=10**7,
        enable_prefix_caching=False,
    )
    first: dict[str, float] = {}
    done: dict[str, tuple[float, float]] = {}
    pending = list(arrivals)
    while pending or core.has_work():
        if not core.has_work():
            core.advance_to(pending[0][0])
        while pending and pending[0][0] <= core.now_us:  # arrived before this step starts: it may join it
            _, rid, prompt, output = pending.pop(0)
            core.add(SimRequest(rid, prompt, output))
        step = core.step()
        for out in step.outputs:
            first.setdefault(out.request_id, step.end_us)
            if out.finished:
                done[out.request_id] = (first[out.request_id], step.end_us)
    return done


def fast_times(arrivals, max_num_seqs: int, budget: int) -> dict[str, tuple[float, float]]:  # type: ignore[no-untyped-def]
    engine = FastEngine(PROFILE, max_num_seqs, budget)
    done: dict[str, tuple[float, float]] = {}
    events = [(t, 1, rid, prompt, output) for t, rid, prompt, output in arrivals]
    heapq.heapify(events)
    version = 0
    segment: tuple[float, int] | None = None
    while events or engine.busy:
        if segment is not None and (not events or segment[0] <= events[0][0]):
            finished = engine.advance()
            for request in finished.finished:
                assert request.first_token_us is not None
                done[request.request_id] = (request.first_token_us, request.finish_us or 0.0)
        else:
            t, _, rid, prompt, output = heapq.heappop(events)
            engine.add(EngineRequest(rid, prompt, output), t)
        version += 1
        segment = (engine.segment_end_us, version) if engine.busy else None
    return done


@pytest.mark.parametrize(
    ("seed", "n", "gap_us", "prompt", "output", "seqs", "budget"),
    [
        (1, 300, 60_000, (500, 6000), (1, 60), 64, 8192),  # prefill-heavy, chunked, bursts
        (2, 300, 150_000, (50, 2000), (50, 600), 16, 2048),  # decode-heavy, a full batch, small budget
        (3, 200, 400_000, (10, 300), (1, 3), 256, 8192),  # mostly idle, one-token answers
    ],
)
def test_first_and_last_token_times_equal_simcore(seed, n, gap_us, prompt, output, seqs, budget) -> None:  # type: ignore[no-untyped-def]
    arrivals = workload(seed, n, gap_us, prompt, output)
    reference = simcore_times(arrivals, seqs, budget)
    fast = fast_times(arrivals, seqs, budget)
    assert set(fast) == set(reference) and len(fast) == n
    for rid, (first_us, last_us) in reference.items():
        assert fast[rid][0] == pytest.approx(first_us, rel=1e-9, abs=1e-3), rid
        assert fast[rid][1] == pytest.approx(last_us, rel=1e-9, abs=1e-3), rid


def test_backlog_counts_admitted_prompts_not_yet_prefilled() -> None:
    engine = FastEngine(PROFILE, max_num_seqs=8, max_num_batched_tokens=4096)
    engine.add(EngineRequest("a", 6000, 5), 0.0)  # 4096 in the first step, 1904 left
    engine.add(EngineRequest("b", 3000, 5), 1.0)  # joins at the next step
    assert engine.prefill_backlog_tokens() == 6000 - 0 + 3000  # the first step's chunk is not done yet
    engine.advance()
    assert engine.prefill_backlog_tokens() == 1904 + 3000  # a's rest and b's first chunk in the step now
    engine.advance()
    assert engine.prefill_backlog_tokens() == 3000 - (4096 - 1904)  # b's rest
    engine.advance()
    assert engine.prefill_backlog_tokens() == 0
