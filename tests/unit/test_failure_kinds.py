"""Failures classified once (llmbus.state.errors): what Redis says while it cannot take writes is
transient, a refused credential or right is fatal, anything else permanent; and what the runtime does
with each (llmbus.bus.bindings): retried in place, the service stopped, the DLQ."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, TopicAuthorizationFailedError
from redis import exceptions as r

from llmbus.bus.consumer import StopService
from llmbus.bus.memory import MemoryBus
from llmbus.bus.producer import PublishTimeout
from llmbus.bus.retry_watch import RetryWatch
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import DeadLetter, PriceBookUpdate
from llmbus.settings import BusSettings
from llmbus.state.errors import Failure, classify

REPLIES = {  # what Redis answers, as redis-py raises it
    r.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."): Failure.TRANSIENT,
    r.ReadOnlyError("You can't write against a read only replica."): Failure.TRANSIENT,
    r.ClusterDownError("The cluster is down"): Failure.TRANSIENT,
    r.TryAgainError("Multiple keys request during rehashing of slot"): Failure.TRANSIENT,
    r.MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."): Failure.TRANSIENT,
    r.BusyLoadingError("Redis is loading the dataset in memory"): Failure.TRANSIENT,
    r.ResponseError("BUSY Redis is busy running a script."): Failure.TRANSIENT,
    r.ResponseError("NOREPLICAS Not enough good replicas to write."): Failure.TRANSIENT,
    r.MovedError("3999 127.0.0.1:6381"): Failure.TRANSIENT,
    r.ConnectionError("Connection closed by server."): Failure.TRANSIENT,
    r.TimeoutError("Timeout reading from socket"): Failure.TRANSIENT,
    r.NoPermissionError("this user has no permissions to run the 'flushall' command"): Failure.FATAL,
    r.AuthenticationError("invalid username-password pair"): Failure.FATAL,
    r.ResponseError("NOPERM No permissions to access a key"): Failure.FATAL,
    r.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"): Failure.PERMANENT,
    r.ResponseError("ERR Error running script"): Failure.PERMANENT,
    r.DataError("Invalid input of type: 'NoneType'"): Failure.PERMANENT,
}


@pytest.mark.parametrize("exc", list(REPLIES), ids=lambda exc: f"{type(exc).__name__}:{str(exc)[:20]}")
def test_each_redis_reply_has_one_kind(exc: Exception) -> None:
    assert classify(exc) is REPLIES[exc]


def test_kafka_and_the_network_are_classified_by_the_same_rule() -> None:
    assert classify(KafkaConnectionError()) is Failure.TRANSIENT
    assert classify(TimeoutError()) is Failure.TRANSIENT
    assert classify(ConnectionRefusedError()) is Failure.TRANSIENT
    assert classify(TopicAuthorizationFailedError()) is Failure.FATAL
    assert classify(MessageSizeTooLargeError()) is Failure.PERMANENT
    assert classify(ValueError("a bug")) is Failure.PERMANENT
    assert classify(PublishTimeout("no ack")) is Failure.PERMANENT  # the bus's own: llmbus.bus.failures


UPDATE = PriceBookUpdate(book={})


async def test_a_transient_redis_reply_is_retried_in_place_and_never_dead_lettered() -> None:
    bus = MemoryBus(BusSettings(topic_prefix="unit."))
    runtime = bus.runtime(contracts.COST, max_attempts=3)
    calls: list[int] = []

    async def handler(update: PriceBookUpdate) -> None:
        calls.append(1)
        if len(calls) < 3:
            raise r.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")

    runtime.subscribe("pricebook", handler)
    await bus.send(bus.topics.name(t.PRICEBOOK), UPDATE)
    assert len(calls) == 3  # two OOMs retried, the third call went through
    assert bus.published(bus.topics.name(t.DLQ), DeadLetter) == []


async def test_a_fatal_failure_stops_the_service_instead_of_dead_lettering_its_record() -> None:
    bus = MemoryBus(BusSettings(topic_prefix="unit."))
    runtime = bus.runtime(contracts.COST, max_attempts=5)
    calls: list[int] = []

    async def handler(update: PriceBookUpdate) -> None:
        calls.append(1)
        raise r.NoPermissionError("this user has no permissions to access one of the keys used as arguments")

    runtime.subscribe("pricebook", handler)
    with pytest.raises(StopService):
        await bus.send(bus.topics.name(t.PRICEBOOK), UPDATE)
    assert len(calls) == 1  # not retried: no retry fixes a missing right
    assert bus.published(bus.topics.name(t.DLQ), DeadLetter) == []


async def test_a_permanent_failure_still_goes_to_the_dlq_with_its_reason() -> None:
    bus = MemoryBus(BusSettings(topic_prefix="unit."))
    runtime = bus.runtime(contracts.COST, max_attempts=5)

    async def handler(update: PriceBookUpdate) -> None:
        raise r.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")

    runtime.subscribe("pricebook", handler)
    await bus.send(bus.topics.name(t.PRICEBOOK), UPDATE)
    [letter] = bus.published(bus.topics.name(t.DLQ), DeadLetter)
    assert "WRONGTYPE" in letter.error


async def test_a_record_retried_past_the_watchdogs_time_makes_the_service_not_live() -> None:
    watch = RetryWatch("unit-live", stuck_after_s=0.05)
    assert watch.live and watch.oldest_s() == 0.0
    retry = watch.begin("llm.results")
    await asyncio.sleep(0.1)
    watch.check(retry)
    assert not watch.live and watch.oldest_s() >= 0.1
    watch.end(retry)
    assert watch.live
