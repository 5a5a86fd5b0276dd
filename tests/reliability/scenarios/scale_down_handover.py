"""The autoscaler's local actuator scales a pool of 2 sim workers to 1, then to 0, under a sampled load beside a
static worker (llmbus_tools.harness.reliability.handover): each drained worker hands its answers over
mid-stream after its 1 s handover grace, and they continue elsewhere as one stream each.

Judged by the delivery audit (no error allowed) and by what every client was shown
(`llmbus_tools.harness.reliability.streams.Streams`); a run that handed no answer over tested nothing and fails."""

from __future__ import annotations

from llmbus_tools.harness.reliability.handover import scale_down_under_load
from llmbus_tools.harness.reliability.verdict import Outcome
from tests.reliability.common import Run, Scenario

MAX_RATE_PER_S = 20.0  # sampled answers stream for seconds: three workers keep up with this many a second


async def run(run: Run) -> Outcome:
    size = run.size
    handover = await scale_down_under_load(
        run.deployment(), run.log_dir, size.requests, min(size.rate_per_s, MAX_RATE_PER_S), size.answer_timeout_s
    )
    handover.outcome.notes.append(
        f"handed over {handover.handed_over} answers; workers SIGTERM to exit, s: {handover.drain_s}"
    )
    return handover.outcome


SCENARIO = Scenario(
    "scale_down_handover", run, "the autoscaler scales a pool 2 → 1 → 0 under load: drained answers handed over"
)
