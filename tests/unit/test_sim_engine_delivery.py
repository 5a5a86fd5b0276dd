"""SimEngine's delivery of step outputs (its per-request outbox) and its token text, made cheap without
changing what comes out: a reader that falls behind the step loop gets exactly what a prompt one
gets, one output per step, in order; a step's text is the tokens' texts drawn one by one."""

from __future__ import annotations

import asyncio

from llmbus_services.engine_worker.adapters.engines.sim import SimConfig, SimEngine
from llmbus_services.engine_worker.adapters.engines.sim.text import AnswerText, content_key
from llmbus_services.engine_worker.core.engine import EngineOutput, EngineRequest

PROMPT = "You are a helpful assistant. " * 20


async def outputs(lag_s: float, divergence: float = 0.0) -> dict[str, list[EngineOutput]]:
    """Four requests at once; each reader waits `lag_s` after every output it takes."""
    engine = SimEngine(SimConfig(speedup=0, divergence=divergence))
    await engine.start()

    async def read(i: int) -> list[EngineOutput]:
        got = []
        async for out in engine.generate(EngineRequest(f"r{i}", PROMPT + str(i), max_tokens=20 + i, seed=i)):
            got.append(out)
            if lag_s:
                await asyncio.sleep(lag_s)
        return got

    results = await asyncio.gather(*(read(i) for i in range(4)))
    await engine.stop()
    return {f"r{i}": r for i, r in enumerate(results)}


async def test_a_reader_behind_the_step_loop_gets_what_a_prompt_reader_gets() -> None:
    prompt = await outputs(lag_s=0)
    behind = await outputs(lag_s=0.002)  # the step loop runs ahead: several steps wait in the outbox
    assert behind == prompt
    assert [o.completion_tokens for o in behind["r3"]] == list(range(1, 24))  # one output per step


async def test_a_diverging_model_still_answers_the_same_way_each_time() -> None:
    assert await outputs(lag_s=0.001, divergence=0.3) == await outputs(lag_s=0, divergence=0.3)


def test_a_steps_text_is_its_tokens_drawn_one_by_one() -> None:
    for divergence in (0.0, 0.4):
        one_by_one = AnswerText(PROMPT, 7, divergence, "m")
        by_step = AnswerText(PROMPT, 7, divergence, "m", reference_key=content_key(PROMPT, 7))
        expected = "".join(one_by_one.next_token() for _ in range(12))
        assert by_step.next_tokens(1) + by_step.next_tokens(5) + by_step.next_tokens(0) + by_step.next_tokens(6) == (
            expected
        )
