"""Two vLLM CPU-build workers (a tiny random-weight Llama) stream sampled answers; one is SIGKILLed
mid-stream (its engine core with it) and not restarted. The other continues every cut answer from the token
ids of what its client was sent (docs/delivery.md, "Continuation across legs").

Judged by the delivery audit (no error allowed), by what every client was shown
(`llmbus_tools.harness.reliability.streams.Streams`: one stream, no error, each leg's chunks exactly its
tokens) and by billing. Runs where vLLM is installed (the `vllm` mark); each engine starts in minutes on a
loaded 2-core machine."""

from __future__ import annotations

from dataclasses import replace

from llmbus_tools.harness.reliability.handover import sampled
from llmbus_tools.harness.reliability.load import Load
from llmbus_tools.harness.reliability.streams import Streams
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from llmbus_tools.harness.tiny_llama import build_tiny_llama
from llmbus_tools.harness.vllm_config import FAST_VLLM_ENV, TEST_GPU_MEMORY_UTILIZATION
from tests.reliability.common import Faults, Run, Scenario, at, deployed, run_scenario

MODEL = "tiny-llama"
WORKERS = ["v1", "v2"]
COLD_START_S = 420  # a CPU engine's cold start on a loaded 2-core machine (tests/integration/test_worker_vllm.py)


def vllm_worker_env() -> dict[str, str]:
    """A vLLM CPU worker of the tiny random-weight Llama (its settings as tests/integration/test_worker_vllm.py)."""
    return {
        "LLMBUS_WORKER_ENGINE": "vllm",
        "LLMBUS_WORKER_MODEL": MODEL,
        "LLMBUS_WORKER_VLLM_MODEL_PATH": str(build_tiny_llama()),
        "LLMBUS_WORKER_VLLM_DTYPE": "float32",
        "LLMBUS_WORKER_VLLM_MAX_MODEL_LEN": "1024",
        "LLMBUS_WORKER_VLLM_MAX_NUM_SEQS": "8",
        "LLMBUS_WORKER_VLLM_IGNORE_EOS": "true",
        "LLMBUS_WORKER_VLLM_WARMUP_ITERATIONS": "1",
        "LLMBUS_WORKER_VLLM_WARMUP_PROMPT_TOKENS": "64",
        "LLMBUS_WORKER_VLLM_ENGINE_CORE_START_METHOD": "fork",
        "LLMBUS_WORKER_VLLM_GPU_MEMORY_UTILIZATION": str(TEST_GPU_MEMORY_UTILIZATION),
        **FAST_VLLM_ENV,
    }


async def run(run: Run) -> Outcome:
    faults = Faults()
    size = replace(run.size, requests=min(run.size.requests, 24 if run.size.requests > 1000 else 12), rate_per_s=2.0)
    size = replace(size, answer_timeout_s=max(size.answer_timeout_s, 300))
    env = {worker: vllm_worker_env() for worker in WORKERS}
    async with deployed(run.deployment(), run.log_dir, WORKERS, env=env, ready_timeout_s=COLD_START_S) as running:
        stack = running.stack

        async def kill() -> None:
            stack.kill("v1")
            faults.note("SIGKILL v1 mid-stream (not restarted)")

        # Long answers (300-420 tokens: seconds each on the CPU build) so the kill finds some mid-stream.
        hooks = {at(size, 0.6): faults.spawn(kill)}
        deployment = running.deployment
        load = Load(deployment, size.requests, size.rate_per_s, make=sampled(deployment, MODEL, (300, 420)))
        running.effects.append(Streams(deployment.topics, words_are_tokens=False))
        return await run_scenario("sigkill_vllm_workers", running, size, hooks, faults, ErrorBudget(), load)


SCENARIO = Scenario(
    "sigkill_vllm_workers",
    run,
    "SIGKILL a vLLM CPU worker mid-stream, not restarted: the other continues its cut answers",
    short_timeout_s=1500,
    vllm=True,
)
