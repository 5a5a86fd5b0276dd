"""Every topic a service reads or writes is in its contract, and on a secured broker its generated ACLs
(llmbus.security.acls, from the contracts) let it do exactly that, as its own principal.

A private SASL/SCRAM broker with the namespace's ACLs (tests/fixtures/secured_kafka.py). Pass criteria,
fixed before the run:
- each service, as its principal, reads every topic its contract declares (the declared group where it
  has one: a commit in that group) and writes every topic it declares, with no authorisation error;
- the handlers that look a result up on llm.results by key (the claim discipline: a worker taking over a
  claim nobody marked done, the scheduler's final error after a lapsed claim, the router's own answer
  after a crash) run under their own principals and find the result already out: one result on
  llm.results, no second answer. Where the contract did not declare that read, the generated ACLs
  denied it, the worker handed the request back and the scheduler published its error after the answer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from llmbus.bus import Bus, make_consumer, make_producer, stop_consumer
from llmbus.bus.admin import ensure_topics
from llmbus.bus.producer import stop_producer
from llmbus.bus.tables import partitions_of, read_log, reader
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.declarations import Contract, Reads
from llmbus.contract.messages import (
    Dispatch,
    DispatchOutcome,
    InferenceResult,
    OutcomeStatus,
    ResultStatus,
)
from llmbus.settings import BusSettings
from llmbus.state.fencing import RequestFence
from llmbus_services.engine_worker.adapters.ending import AttemptEnd
from llmbus_services.router.config import RouterSettings
from llmbus_services.router.flows.requests import RequestFlow
from llmbus_services.scheduler.adapters.store import PlacementStore
from llmbus_services.scheduler.app import build_core
from llmbus_services.scheduler.config import SchedulerSettings
from llmbus_services.scheduler.core.scheduler import FinalError
from llmbus_services.scheduler.core.types import SchedRequest
from llmbus_services.scheduler.flows import SchedulerHandlers
from llmbus_services.scheduler.flows.placement import internal_error
from tests.fixtures.secured_kafka import SecuredKafka
from tests.integration.test_security import fresh_namespace
from tests.integration.test_worker_result_after_crash import LEASE_S, dispatch_of
from tests.support import redis_keys

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow]
GATEWAY_REPLIES = "gw-acl"
# What a placeholder of a declared topic or group stands for in this namespace.
PLACES = {"<worker_id>": "w1", "<instance>": "acme", "<tenant>": "acme"}
GROUP_PLACES = {"worker_id": "w1", "instance": "s1"}


def names_of(prefix: str, contract: Contract, reads: Reads | None = None) -> list[str]:
    """The full names of a contract's declared topics (of one subscription, or every one written)."""
    declared = reads.topics if reads is not None else tuple(sorted(contract.write_topics()))
    names = []
    for topic in declared:
        for placeholder, value in PLACES.items():
            if contract.service == t.GATEWAY and placeholder == "<instance>":
                value = GATEWAY_REPLIES  # the gateway reads its own instance's reply topic
            topic = topic.replace(placeholder, value)
        names.append(t.Topics(prefix).name(topic))
    return names


@pytest.fixture(scope="module")
async def prefix(secured_kafka: SecuredKafka) -> str:
    prefix = await fresh_namespace(secured_kafka)
    admin = secured_kafka.settings("admin", prefix)
    await ensure_topics(admin, [(t.Topics(prefix).replies(GATEWAY_REPLIES), t.REPLIES_SPEC)])
    return prefix


async def read_every_partition(settings: BusSettings, topics: list[str]) -> None:
    consumer = reader(settings)
    await asyncio.wait_for(consumer.start(), 30)
    try:
        tps = await partitions_of(settings, topics)
        consumer.assign(tps)
        await asyncio.wait_for(consumer.end_offsets(tps), 30)
        await consumer.seek_to_beginning(*tps)
        await asyncio.wait_for(consumer.getmany(timeout_ms=500), 30)
    finally:
        await asyncio.wait_for(consumer.stop(), 30)


async def commit_in_group(settings: BusSettings, group: str, topics: list[str]) -> None:
    consumer = make_consumer(settings, group_id=group, client_id=f"acl-{settings.kafka_sasl_username}")
    await asyncio.wait_for(consumer.start(), 30)
    try:
        tps = await partitions_of(settings, topics)
        consumer.assign(tps)
        await asyncio.wait_for(consumer.commit(dict.fromkeys(tps, 0)), 30)
    finally:
        await stop_consumer(consumer, 30)


async def write_each(settings: BusSettings, topics: list[str]) -> None:
    producer = make_producer(settings, client_id=f"acl-{settings.kafka_sasl_username}")
    await asyncio.wait_for(producer.start(), 30)
    try:
        for topic in topics:
            sent = await asyncio.wait_for(producer.send(topic, b"{}", key=b"acl-check"), 30)
            await asyncio.wait_for(sent, 30)
    finally:
        await stop_producer(producer, 30)


@pytest.mark.parametrize("contract", contracts.SERVICES, ids=lambda c: c.service)
async def test_each_service_reads_and_writes_what_its_contract_declares_under_its_own_acls(
    secured_kafka: SecuredKafka, prefix: str, contract: Contract
) -> None:
    settings = secured_kafka.settings(contract.service, prefix)
    topics = t.Topics(prefix)
    for reads in contract.reads:
        names = names_of(prefix, contract, reads)
        if reads.group is None:
            await read_every_partition(settings, names)
        else:
            group = reads.group_id(topics, contract.service, **GROUP_PLACES)
            assert group is not None
            await commit_in_group(settings, group, names)
    await write_each(settings, names_of(prefix, contract))


@pytest.fixture
async def fence(redis_up: None) -> AsyncIterator[RequestFence]:
    """The final markers under a namespace of their own, with a short claim lease."""
    client = redis.Redis.from_url(BusSettings().redis_url)
    namespace = f"test-{uuid.uuid4().hex[:10]}:"
    yield RequestFence(client, namespace, final_ttl_s=600, claim_lease_s=LEASE_S)
    if keys := await redis_keys(client, f"llmbus:{namespace}*"):
        await client.delete(*keys)
    await client.aclose()


async def answered_and_died(secured_kafka: SecuredKafka, prefix: str, fence: RequestFence, dispatch: Dispatch) -> None:
    """Attempt 1 claimed the result, wrote it (as the worker it was) and died before marking it done."""
    claim = await fence.claim_first(dispatch.request_key, dispatch.attempt, int(time.time() * 1000))
    assert claim.claimed
    result = InferenceResult(
        request_id=dispatch.request_id, tenant="acme", status=ResultStatus.OK, model="m", text="the answer", attempt=1
    )
    bus = await Bus.start(secured_kafka.settings(t.WORKER, prefix), t.WORKER, client_suffix="-dead")
    try:
        await bus.publisher.publish(bus.topics.name(t.RESULTS), result, key=result.request_id)
    finally:
        await bus.stop()


async def results_of(secured_kafka: SecuredKafka, prefix: str, request_id: str) -> list[InferenceResult]:
    operator = secured_kafka.settings("operator", prefix)
    results = await read_log(operator, t.Topics(prefix).name(t.RESULTS), InferenceResult)
    return [result for _, result in results if result.request_id == request_id]


async def test_a_worker_taking_over_a_claim_nobody_marked_reads_the_result_under_its_acls(
    secured_kafka: SecuredKafka, prefix: str, fence: RequestFence
) -> None:
    dispatch = dispatch_of(f"w-{uuid.uuid4().hex[:8]}", attempt=1)
    await answered_and_died(secured_kafka, prefix, fence, dispatch)
    bus = await Bus.start(secured_kafka.settings(t.WORKER, prefix), t.WORKER)
    try:
        again = InferenceResult(
            request_id=dispatch.request_id, tenant="acme", status=ResultStatus.OK, model="m", text="again", attempt=1
        )
        await AttemptEnd(bus, fence, "w1").publish_final(
            dispatch, again, bus.topics.replies("acme"), -1, OutcomeStatus.COMPLETED
        )
    finally:
        await bus.stop()
    assert [r.text for r in await results_of(secured_kafka, prefix, dispatch.request_id)] == ["the answer"]
    operator = secured_kafka.settings("operator", prefix)
    outcomes = await read_log(operator, t.Topics(prefix).name(t.OUTCOMES), DispatchOutcome)
    assert [o.status for _, o in outcomes if o.request_id == dispatch.request_id] == [OutcomeStatus.DUPLICATE]


async def test_the_schedulers_final_error_after_a_lapsed_claim_reads_the_result_under_its_acls(
    secured_kafka: SecuredKafka, prefix: str, fence: RequestFence
) -> None:
    dispatch = dispatch_of(f"s-{uuid.uuid4().hex[:8]}", attempt=1)
    await answered_and_died(secured_kafka, prefix, fence, dispatch)
    await asyncio.sleep(LEASE_S + 0.3)  # the claim lapses: the scheduler gives up on the request (deadline)
    bus = await Bus.start(secured_kafka.settings(t.SCHEDULER, prefix), t.SCHEDULER)
    try:
        settings = SchedulerSettings(instance_id="s1")
        store = PlacementStore(fence._client, f"t{uuid.uuid4().hex[:10]}.scheduler", "s1")
        handlers = SchedulerHandlers(bus, settings, build_core(settings), store, fence)
        request = SchedRequest.from_routed(dispatch.routed, int(time.time() * 1000), settings.prefix_block_tokens, 0)
        await handlers._fail(FinalError(request, internal_error(TimeoutError("deadline"))))
    finally:
        await bus.stop()
    assert [r.text for r in await results_of(secured_kafka, prefix, dispatch.request_id)] == ["the answer"]
    assert await fence.holder(dispatch.request_key) == "done:1"


async def test_the_routers_own_answer_after_a_crash_reads_the_result_under_its_acls(
    secured_kafka: SecuredKafka, prefix: str, fence: RequestFence
) -> None:
    dispatch = dispatch_of(f"r-{uuid.uuid4().hex[:8]}", attempt=1)
    await answered_and_died(secured_kafka, prefix, fence, dispatch)
    await asyncio.sleep(LEASE_S + 0.3)  # the claim lapses; the request record comes to a router again
    bus = await Bus.start(secured_kafka.settings(t.ROUTER, prefix), t.ROUTER)
    try:
        flow = RequestFlow(bus, RouterSettings(), core=None, budgets=None, fence=fence)  # type: ignore[arg-type]
        assert not await flow._claim_answer(dispatch.request_key)  # the result is out: nothing to answer
    finally:
        await bus.stop()
    assert await fence.holder(dispatch.request_key) == "done:1"


def test_every_look_up_of_llm_results_is_declared() -> None:
    """The services that take over claims declare the look-up their ACLs are generated from."""
    for contract in (contracts.ROUTER, contracts.SCHEDULER, contracts.WORKER):
        assert contract.looks_up(t.RESULTS), contract.service
        assert contract.service in t.BY_NAME[t.RESULTS].readers
