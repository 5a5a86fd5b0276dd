"""The openai-http engine's failure policy against real HTTP upstreams that fail as hosted providers do
(llmbus_tools/harness/openai_faults.py), one fault at a time, in the worker's flow (its legs, chunks and
result; the bus recorded in memory).

Two deployments of one model, the first failing: every fault ends in the whole answer, from the second
deployment, or continued there in a second leg from where the first broke off (its words `w<k>`, then the
second's `f<k>`: no word missing, none twice). One deployment: the engine gives the request back with why
(another worker, the route's next model, or the final error), or gets through a transient fault on the same
upstream. Each within a stated bound."""

from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiokafka.structs import ConsumerRecord

from llmbus.contract.messages import (
    ChatMessage,
    Continuation,
    Dispatch,
    DispatchOutcome,
    ErrorCode,
    InferenceRequest,
    InferenceResult,
    Leg,
    LegEnd,
    OutcomeStatus,
    RoutedRequest,
    TokenChunk,
)
from llmbus_services.engine_worker.adapters.engines.openai_http import OpenAIHttpEngine
from llmbus_services.engine_worker.adapters.engines.openai_http_config import OpenAIHttpConfig
from llmbus_services.engine_worker.core.continuation import continued
from llmbus_services.engine_worker.core.engine import (
    EngineOutput,
    EngineRequest,
    LegCut,
    UpstreamBusy,
    UpstreamFailed,
)
from llmbus_tools.harness.openai_faults import Fault
from llmbus_tools.harness.openai_server import FakeOpenAIServer
from tests.unit.test_worker_request_errors import worker

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOKENS = 20
FIRST_TOKEN_S, STALL_S = 1.0, 0.5  # the test's timeouts; the defaults' are measured in bench/reports
SLACK_S = 2.0  # scheduling on a shared machine (2 cores, load average 15 while these ran)


@pytest_asyncio.fixture(loop_scope="session")
async def upstreams() -> AsyncIterator[tuple[FakeOpenAIServer, FakeOpenAIServer]]:
    bad, good = FakeOpenAIServer(), FakeOpenAIServer(word="f")
    await bad.start()
    await good.start()
    yield bad, good
    await bad.stop()
    await good.stop()


async def engine(bad: FakeOpenAIServer, good: FakeOpenAIServer | None, **settings: object) -> OpenAIHttpEngine:
    deployments = [{"name": "bad", "base_url": bad.base_url}]
    if good is not None:
        deployments.append({"name": "good", "base_url": good.base_url})
    config = {
        "base_url": bad.base_url,
        "model": "m",
        "continuation": "continue_final_message",
        "first_token_timeout_s": FIRST_TOKEN_S,
        "stall_timeout_s": STALL_S,
        "deployments": deployments,
    }
    started = OpenAIHttpEngine(OpenAIHttpConfig.model_validate(config | settings))
    await started.start()
    return started


def ask(request_id: str = "r", tokens: int = TOKENS) -> EngineRequest:
    return EngineRequest(
        request_id, "hi", max_tokens=tokens, messages=(ChatMessage(role="user", content="hi"),), temperature=0.7
    )


async def answer(e: OpenAIHttpEngine, request: EngineRequest) -> list[EngineOutput]:
    return [o async for o in e.generate(request)]


async def answer_under(
    fault: Fault, bad: FakeOpenAIServer, e: OpenAIHttpEngine, request_id: str
) -> tuple[InferenceResult, list[TokenChunk], float]:
    """The worker's result and chunks of one chat request, and the seconds it took, with `fault` on the bad
    upstream."""
    handlers, publisher = worker(e)  # type: ignore[arg-type]
    request = InferenceRequest(
        request_id=request_id, messages=[ChatMessage(role="user", content="hi")], max_tokens=TOKENS, temperature=0.7
    )
    raw = Dispatch(routed=RoutedRequest(request=request, model="m"), worker_id="w1", attempt=1).to_bytes()
    bad.faults = [fault]
    started = time.monotonic()
    try:
        await handlers.on_dispatch(ConsumerRecord("x.llm.dispatch.w1", 0, 0, 0, 0, None, raw, None, 0, len(raw), []))
    finally:
        bad.faults = []
        await e.stop()
    took_s = time.monotonic() - started
    outcomes = publisher.of(DispatchOutcome)
    assert [o.status for o in outcomes] == [OutcomeStatus.COMPLETED], outcomes
    [result] = publisher.of(InferenceResult)
    return result, publisher.of(TokenChunk), took_s


def words(prefix: str, start: int, stop: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(start, stop)]


FAULTS = {
    "429 short Retry-After": Fault("status", 429, "1"),
    "429 long Retry-After": Fault("status", 429, "30"),
    "500": Fault("status", 500),
    "503": Fault("status", 503),
    "connection reset": Fault("reset"),
    "stall before the first byte": Fault("stall_first_byte"),
    "empty 200": Fault("empty_200"),
    "stall mid-answer": Fault("stall_mid"),
    "cut mid-answer": Fault("cut_mid"),
    "malformed SSE mid-answer": Fault("malformed_mid"),
}
# Within: the first deployment's failure noticed, then the second deployment's answer (instant here).
NOTICED_S = {"stall before the first byte": FIRST_TOKEN_S, "stall mid-answer": STALL_S}


@pytest.mark.parametrize("name", list(FAULTS))
async def test_every_fault_of_one_deployment_ends_in_the_whole_answer_from_the_other(
    upstreams: tuple[FakeOpenAIServer, FakeOpenAIServer], name: str
) -> None:
    bad, good = upstreams
    fault = copy.deepcopy(FAULTS[name])
    result, chunks, took_s = await answer_under(fault, bad, await engine(bad, good), f"two-{fault.kind}")
    text = result.text.split()
    assert "".join(c.delta for c in chunks) == result.text  # what the client was sent
    assert [c.seq for c in chunks] == list(range(len(chunks))) and {c.attempt for c in chunks} == {1}
    if fault.kind in ("stall_mid", "cut_mid", "malformed_mid"):
        # A second leg on the other deployment continued the partial answer: no word lost, none repeated.
        assert text == words("w", 0, fault.after_tokens) + words("f", fault.after_tokens, TOKENS)
        continued = good.seen[-1].body
        assert continued["continue_final_message"] is True and continued["add_generation_prompt"] is False
        assert continued["messages"][-1] == {"role": "assistant", "content": "".join(f" w{i}" for i in range(8))}
        assert continued["max_tokens"] == TOKENS - fault.after_tokens and continued["temperature"] == 0.7
        assert result.legs is not None
        legs = [(leg.deployment, leg.completion_tokens, leg.first_seq, leg.ended) for leg in result.legs]
        assert legs == [
            ("bad", fault.after_tokens, 0, LegEnd.UPSTREAM_FAILED),
            ("good", TOKENS - fault.after_tokens, fault.after_tokens, LegEnd.COMPLETED),
        ]
    else:
        assert text == words("f", 0, TOKENS) and result.legs is None  # one leg: nothing of the first went out
    assert result.finish_reason == "length" and result.usage.completion_tokens == TOKENS
    assert took_s < NOTICED_S.get(name, 0.0) + SLACK_S, took_s


@pytest.mark.parametrize(
    ("name", "error", "code", "bound_s"),
    [
        ("429 long Retry-After", UpstreamBusy, ErrorCode.OVER_CAPACITY, SLACK_S),  # not 30 s: falls back now
        ("500", UpstreamFailed, ErrorCode.MODEL_UNAVAILABLE, 0.25 + SLACK_S),  # one try more after 0.25 s
        ("connection reset", UpstreamFailed, ErrorCode.MODEL_UNAVAILABLE, 0.25 + SLACK_S),
        ("empty 200", UpstreamFailed, ErrorCode.MODEL_UNAVAILABLE, 0.25 + SLACK_S),
        ("stall before the first byte", UpstreamFailed, ErrorCode.MODEL_UNAVAILABLE, FIRST_TOKEN_S + SLACK_S),
    ],
)
async def test_with_one_deployment_the_request_goes_back_with_why_within_the_bound(
    upstreams: tuple[FakeOpenAIServer, FakeOpenAIServer], name: str, error: type, code: ErrorCode, bound_s: float
) -> None:
    bad, _ = upstreams
    bad.faults = [copy.deepcopy(FAULTS[name])]
    e = await engine(bad, None)
    started = time.monotonic()
    try:
        with pytest.raises(error) as gone:
            await answer(e, ask(f"one-{name}"))
    finally:
        bad.faults = []
        await e.stop()
    assert type(gone.value) is error and gone.value.code == code and gone.value.retryable
    assert time.monotonic() - started < bound_s
    if name == "429 long Retry-After":
        assert 29 < gone.value.retry_after_s <= 30  # type: ignore[attr-defined]  # the upstream's, for the client


@pytest.mark.parametrize("name", ["429 short Retry-After", "503", "500", "connection reset", "cut mid-answer"])
async def test_a_transient_fault_once_is_retried_on_the_same_upstream(
    upstreams: tuple[FakeOpenAIServer, FakeOpenAIServer], name: str
) -> None:
    """The one deployment fails once; the same request tries it again (after its Retry-After of 1 s, the
    busy cooldown of 1 s without one, or the 0.25 s backoff) and the answer is whole."""
    bad, _ = upstreams
    fault = copy.deepcopy(FAULTS[name])
    fault.times = 1
    result, _, took_s = await answer_under(fault, bad, await engine(bad, None), f"once-{name}")
    if fault.kind == "cut_mid":  # the same deployment continues what it had sent, in a second leg
        assert result.text.split() == words("w", 0, TOKENS) and result.legs is not None and len(result.legs) == 2
    else:
        assert result.text.split() == words("w", 0, TOKENS)
    waits_s = {"status": 1.0 if fault.status in (429, 503) else 0.25, "reset": 0.25, "cut_mid": 0.0}[fault.kind]
    assert waits_s <= took_s < waits_s + SLACK_S


async def test_an_answer_broken_off_twice_on_its_only_deployment_goes_back_with_what_it_had(
    upstreams: tuple[FakeOpenAIServer, FakeOpenAIServer],
) -> None:
    """Continued once on the same deployment (8 words more), broken off again: the leg ends and cannot go on
    in this process (the deployment failed it past `retries`), so the engine hands it on (another worker,
    the chain's next model) with what it streamed in this leg."""
    bad, _ = upstreams
    bad.faults = [Fault("cut_mid")]
    e = await engine(bad, None)
    first: list[EngineOutput] = []
    try:
        with pytest.raises(LegCut) as cut:
            async for out in e.generate(ask("twice")):
                first.append(out)
        assert cut.value.in_process and cut.value.deployment == "bad"
        so_far = Continuation(
            text="".join(o.delta for o in first),
            completion_tokens=8,
            next_seq=8,
            legs=[Leg(attempt=1, deployment="bad", completion_tokens=8, ended=LegEnd.UPSTREAM_FAILED)],
        )
        second: list[EngineOutput] = []
        with pytest.raises(LegCut) as again:
            async for out in e.generate(continued(ask("twice"), so_far)):
                second.append(out)
    finally:
        bad.faults = []
        await e.stop()
    assert not again.value.in_process and again.value.code == ErrorCode.MODEL_UNAVAILABLE
    assert "".join(o.delta for o in first + second).split() == words("w", 0, 16)
    assert [o.deployment for o in second] == ["bad"] * 8 and second[-1].completion_tokens == 8  # its own count


async def test_an_upstream_without_continuation_is_not_asked_to_continue(
    upstreams: tuple[FakeOpenAIServer, FakeOpenAIServer],
) -> None:
    """`continuation: none` (OpenAI's API): a cut after tokens went out is not continued there, nor started
    again (that would repeat the words the client has): the leg ends, handed on to another worker."""
    bad, good = upstreams
    bad.faults = [Fault("cut_mid")]
    sent = len(good.seen)
    e = await engine(bad, good, continuation="none")
    try:
        with pytest.raises(LegCut) as cut:
            await answer(e, ask("no-continuation"))
        assert not e.can_continue(ask("no-continuation"))
    finally:
        bad.faults = []
        await e.stop()
    assert not cut.value.in_process and len(good.seen) == sent


async def test_deepseek_style_prefix_continuation(upstreams: tuple[FakeOpenAIServer, FakeOpenAIServer]) -> None:
    bad, good = upstreams
    e = await engine(bad, good, continuation="prefix")
    result, _, _ = await answer_under(Fault("malformed_mid", after_tokens=5), bad, e, "prefix")
    assert result.text.split() == words("w", 0, 5) + words("f", 5, TOKENS)
    last = good.seen[-1].body["messages"][-1]
    assert last["role"] == "assistant" and last["prefix"] is True and "continue_final_message" not in good.seen[-1].body


async def test_a_context_length_exceeded_is_not_tried_on_another_deployment(
    upstreams: tuple[FakeOpenAIServer, FakeOpenAIServer],
) -> None:
    bad, good = upstreams
    bad.faults = [Fault("context_length_exceeded", window=4096)]
    sent = len(good.seen)
    e = await engine(bad, good)
    try:
        with pytest.raises(UpstreamFailed) as too_long:
            await answer(e, ask("too-long"))
    finally:
        bad.faults = []
        await e.stop()
    assert too_long.value.code == ErrorCode.PROMPT_TOO_LONG and too_long.value.prompt_tokens == 4097
    assert len(good.seen) == sent  # every deployment has the model's window


async def test_deployments_share_the_load_by_their_limits(upstreams: tuple[FakeOpenAIServer, FakeOpenAIServer]) -> None:
    """rpm 2 on the first, 4 on the second: six requests go 2 and 4; a seventh finds both at their limit
    and goes back busy, with when the first frees (a minute after its first request)."""
    bad, good = upstreams
    first, second = len(bad.seen), len(good.seen)
    e = await engine(
        bad, good, deployments=[{"base_url": bad.base_url, "rpm": 2}, {"base_url": good.base_url, "rpm": 4}]
    )
    try:
        for i in range(6):
            await answer(e, ask(f"rpm-{i}", tokens=2))
        assert (len(bad.seen) - first, len(good.seen) - second) == (2, 4)
        with pytest.raises(UpstreamBusy, match="limits") as busy:
            await answer(e, ask("rpm-7", tokens=2))
        assert 55 < busy.value.retry_after_s <= 60
    finally:
        await e.stop()
