"""A new model version's whole path on the real broker: shadow → A/B ramp → 100 %, or rollback.

Processes: router, scheduler, shadow-comparator and three sim workers — control `sim-ctrl`
(A100 step times), a worse candidate `sim-bad` (same speed, answers drift: 85 % of tokens differ)
and a better one `sim-good` (H100 step times, the reference answers). The operator's
records are written with the CLI's own publishing function (`llmbus models register`,
`llmbus experiments create`; the commands themselves are tested in test_experiments_cli.py);
everything after that is the comparator's doing.

Two sizes of the same run, compressed by configuration (decision tick 0.5 s, 12 candidate
samples per step, guardrails evaluated from 4, no minimum time per step):
- `fast` (in `make test`): sim time / 10, ramp shadow → 50 → 100 %;
- `long` (`make test-long`): sim time / 4, the default plan shadow → 1 → 5 → 25 → 50 → 100 %
  (the 1 % step alone needs ~1,200 requests for 12 candidate samples).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

import pytest

from llmbus.bus.tables import read_log, read_table
from llmbus.cli.experiments import publish_record
from llmbus.client import LlmbusClient
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Comparison,
    Experiment,
    ExperimentDecision,
    ExperimentState,
    Guardrails,
    InferenceResult,
    ModelSpec,
    RampPlan,
    TokenChunk,
    now_ms,
)
from llmbus.contract.messages.experiments import DEFAULT_RAMP_PCT
from llmbus.domain.lifecycle import create
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from tests.support import eventually, user_request

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow]

WORKERS = {
    "sim-ctrl": {"LLMBUS_WORKER_SIM_PROFILE": "llama-3.1-8b-a100"},
    "sim-bad": {"LLMBUS_WORKER_SIM_PROFILE": "llama-3.1-8b-a100", "LLMBUS_WORKER_SIM_DIVERGENCE": "0.85"},
    "sim-good": {"LLMBUS_WORKER_SIM_PROFILE": "llama-3.1-8b-h100"},
}
# The router reads a new step from llm.experiments a moment after the decision: requests sent
# within this grace may still get the previous split.
ROUTER_GRACE_MS = 1000


# With 4 samples a p95 is the sample's maximum, and on a shared 2-core machine total latency is mostly
# the bus's tail (seconds under load): a tight latency guardrail would roll the better candidate back on
# noise (seen: +63 % on 4 samples at the 1 % step). The latency guardrail's rollback is tested in
# tests/unit/test_comparator_core.py; here it only catches a candidate 4x slower.
LOOSE_LATENCY = Guardrails(min_samples=4, max_p95_regression=3.0)


# Candidate samples per step. The shadow step's similarity floor breaks on an always-valid bound, so
# few samples may not be evidence enough: sim-bad's ROUGE-L against the control is 0.26 +- 0.10 over
# 12 tokens, and the bound falls below the 0.5 floor on 4 pairs in 79 % of draws, on 8 in 97 %, on 12
# in all of 2,000 (sampled from 2,000 sim answers). With 4, the comparator promoted sim-bad in about
# one run in five (a CI failure); 12 makes the rollback this test expects the comparator's certain answer.
SAMPLES_PER_STEP = 12


@dataclass(frozen=True)
class Size:
    sim_speedup: float
    ramp: RampPlan
    guardrails: Guardrails
    promote_timeout_s: float


FAST = Size(
    sim_speedup=10,
    ramp=RampPlan(steps_pct=[0, 50, 100], min_samples_per_step=SAMPLES_PER_STEP, min_step_s=0),
    guardrails=LOOSE_LATENCY,
    promote_timeout_s=180,
)
LONG = Size(
    sim_speedup=4,
    ramp=RampPlan(steps_pct=list(DEFAULT_RAMP_PCT), min_samples_per_step=SAMPLES_PER_STEP, min_step_s=0),
    guardrails=LOOSE_LATENCY,
    promote_timeout_s=900,
)


class Load:
    """Steady traffic to the control model from many users; remembers which model answered each."""

    def __init__(self, settings: BusSettings) -> None:
        self.settings = settings
        # (request id, model of the chunks, any shadow chunk, sent at ms)
        self.answered: list[tuple[str, str, bool, int]] = []
        self.stop = asyncio.Event()
        self.failed = 0
        self.rng = random.Random(7)
        self.first_chunk_ms: dict[str, int] = {}  # request id → when its first chunk arrived

    async def run(self, concurrency: int = 8) -> None:
        async with LlmbusClient(self.settings) as client:
            await asyncio.gather(*[self._user_loop(client) for _ in range(concurrency)])

    async def _user_loop(self, client: LlmbusClient) -> None:
        while not self.stop.is_set():
            request = user_request("sim-ctrl", self.rng)
            sent_at_ms = now_ms()
            chunks: list[TokenChunk] = []
            try:
                async for chunk in client.stream(request, timeout_s=60):
                    if not chunks:
                        self.first_chunk_ms[request.request_id] = now_ms()
                    chunks.append(chunk)
            except TimeoutError:
                self.failed += 1  # a loaded machine; the experiment's verdicts don't depend on one request
                continue
            models = {c.model for c in chunks if c.model}
            assert len(models) <= 1, models
            # A refusal (the default tenant's rate limit, hit when the sim runs fast) names the model
            # asked for, but nobody answered: it counts as an error, not as the control's answer.
            refused = any(c.error is not None for c in chunks)
            model = models.pop() if models and not refused else "error"
            self.answered.append((request.request_id, model, any(c.shadow for c in chunks), sent_at_ms))

    def models_since(self, index: int) -> Counter[str]:
        return Counter(model for _, model, _, _ in self.answered[index:])

    def models_between(self, start_ms: int, end_ms: int) -> Counter[str]:
        return Counter(model for _, model, _, sent in self.answered if start_ms <= sent < end_ms)


async def experiment(settings: BusSettings, experiment_id: str) -> Experiment | None:
    return (await read_table(settings, t.Topics(settings.topic_prefix).name(t.EXPERIMENTS), Experiment)).get(
        experiment_id
    )


async def decisions(settings: BusSettings, experiment_id: str) -> list[ExperimentDecision]:
    log = await read_log(settings, t.Topics(settings.topic_prefix).name(t.DECISIONS), ExperimentDecision)
    return [d for key, d in log if key == experiment_id]


@pytest.fixture
def load_task() -> Iterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(FAST, id="fast", marks=pytest.mark.timeout(400)),
        pytest.param(LONG, id="long", marks=[pytest.mark.long, pytest.mark.timeout(1500)]),
    ],
)
async def test_worse_candidate_rolled_back_in_shadow_better_one_ramped_to_100(
    bus_settings: BusSettings, services: list[ServiceProc], load_task: list[asyncio.Task[None]], size: Size
) -> None:
    s = bus_settings
    services.append(ServiceProc("llmbus_services.router", s).start())
    # A loaded CI machine can delay heartbeats by seconds: don't let the scheduler declare workers dead.
    services.append(
        ServiceProc("llmbus_services.scheduler", s, env={"LLMBUS_SCHEDULER_HEARTBEAT_STALE_S": "30"}).start()
    )
    services.append(
        ServiceProc(
            "llmbus_services.shadow_comparator",
            s,
            env={
                "LLMBUS_COMPARATOR_DECIDE_INTERVAL_S": "0.5",
                "LLMBUS_COMPARATOR_SWEEP_INTERVAL_S": "1",
                "LLMBUS_COMPARATOR_PAIR_TTL_S": "30",
            },
        ).start()
    )
    for model, env in WORKERS.items():
        worker_env = {
            "LLMBUS_WORKER_WORKER_ID": model,
            "LLMBUS_WORKER_MODEL": model,
            "LLMBUS_WORKER_SIM_SPEEDUP": str(size.sim_speedup),
        }
        services.append(ServiceProc("llmbus_services.engine_worker", s, name=model, env=worker_env | env).start())
    await wait_workers_ready(s, set(WORKERS), timeout_s=240)
    for model in WORKERS:  # what `llmbus models register` does (its parsing is tested in test_experiments_cli)
        await publish_record(s, t.MODELS, model, ModelSpec(name=model, max_output_tokens=256))

    load = Load(s)
    load_task.append(asyncio.create_task(load.run()))
    plan = {"ramp": size.ramp, "guardrails": size.guardrails}

    # 1. The worse candidate, in shadow: compared, never seen by a user, rolled back by the comparator.
    await publish_record(s, t.EXPERIMENTS, "exp-bad", create("exp-bad", "sim-ctrl", "sim-bad", **plan))

    async def rolled_back() -> bool:
        e = await experiment(s, "exp-bad")
        return e is not None and e.state == ExperimentState.ROLLED_BACK

    await eventually(rolled_back, timeout_s=240, interval_s=0.5)
    bad = await decisions(s, "exp-bad")
    assert all(d.variants and d.tests and d.reasons for d in bad)
    [rollback] = [d for d in bad if d.decision == "rollback"]
    assert any("similarity" in reason for reason in rollback.reasons), rollback.reasons
    shadow_evidence = {v.variant: v for v in rollback.variants}["candidate(shadow)"]
    assert shadow_evidence.samples >= 4 and shadow_evidence.similarity_mean < 0.5  # type: ignore[operator]
    assert rollback.tests and rollback.share_to_pct == 0

    # 2. The better candidate: shadow, then every A/B step of the plan up to 100 % of users.
    await publish_record(s, t.EXPERIMENTS, "exp-good", create("exp-good", "sim-ctrl", "sim-good", **plan))

    async def promoted() -> bool:
        e = await experiment(s, "exp-good")
        return e is not None and e.state == ExperimentState.PROMOTED

    await eventually(promoted, timeout_s=size.promote_timeout_s, interval_s=0.5)
    good = await decisions(s, "exp-good")
    promotions = [d for d in good if d.decision == "promote"]
    # Requests sent once the router has had time to read the last step; a few of them answered.
    all_in_ms = promotions[-1].decided_at_ms + ROUTER_GRACE_MS
    await eventually(lambda: _answered_sent_after(load, all_in_ms, 6), timeout_s=60)
    load.stop.set()
    await asyncio.wait_for(load_task[0], 90)

    # Every step in order, each decision with its evidence.
    steps = size.ramp.steps_pct
    assert [(d.share_from_pct, d.share_to_pct) for d in promotions] == list(pairwise(steps))
    assert all(d.variants and d.tests and d.reasons for d in good)
    # A shadow candidate never reached a user: no answer from sim-bad, none from sim-good before its
    # first ramp decision, no chunk flagged shadow on the client's reply topic.
    assert set(load.models_since(0)) <= {"sim-ctrl", "sim-good", "error"}
    # (By the answer's arrival: a request sent just before the first ramp decision may be routed after it.)
    first_ramp_ms = promotions[0].decided_at_ms
    early = [
        rid for rid, model, _, _ in load.answered if model == "sim-good" and load.first_chunk_ms[rid] < first_ramp_ms
    ]
    assert not early, early
    assert not any(shadow for _, _, shadow, _ in load.answered)
    # The router followed each step: what users got between two decisions (printed), some of the
    # candidate during the A/B steps, and only the candidate once the last step was read.
    edges = [p.decided_at_ms for p in promotions] + [now_ms()]
    for p, start, end in zip(promotions, edges, edges[1:], strict=False):
        print(f"at {p.share_to_pct:g} %: {dict(load.models_between(start, end))}")
    assert load.models_between(promotions[0].decided_at_ms, promotions[-1].decided_at_ms)["sim-good"] > 0
    after = load.models_between(all_in_ms, now_ms())
    assert set(after) - {"error"} == {"sim-good"}, after

    # Comparisons on llm.comparisons for shadowed requests of both experiments.
    topics = t.Topics(s.topic_prefix)
    comparisons = [c for _, c in await read_log(s, topics.name(t.COMPARISONS), Comparison, timeout_s=60)]
    by_exp = Counter(c.experiment_id for c in comparisons)
    assert by_exp["exp-bad"] >= 4 and by_exp["exp-good"] >= 4
    answered_ids = {rid for rid, _, _, _ in load.answered}
    assert {c.request_id for c in comparisons} <= answered_ids
    good_pairs = [c for c in comparisons if c.experiment_id == "exp-good"]
    assert all(c.similarity == 1.0 and c.candidate.model == "sim-good" for c in good_pairs)
    # The candidate really ran: its results are on llm.results, flagged shadow, and nobody streamed them.
    shadow_results = [
        r for _, r in await read_log(s, topics.name(t.RESULTS), InferenceResult, timeout_s=60) if r.shadow
    ]
    assert {r.model for r in shadow_results} == {"sim-bad", "sim-good"}


async def _answered_sent_after(load: Load, start_ms: int, n: int) -> bool:
    return sum(1 for _, _, _, sent in load.answered if sent >= start_ms) >= n
