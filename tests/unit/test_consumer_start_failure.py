"""A consumer whose start fails (no broker answers, a timeout) is stopped, not left open.

aiokafka warns "Unclosed AIOKafkaConsumer" for each one never stopped, and it keeps its
connections until it is collected. Against an address nobody listens on, start() fails at once.
"""

from __future__ import annotations

import socket

import pytest
from aiokafka import AIOKafkaConsumer

from llmbus.bus import consumer as bus_consumer
from llmbus.bus import tables
from llmbus.bus.memory import MemoryLog, MemoryPublisher
from llmbus.bus.runtime import Bus
from llmbus.bus.service import ServiceRuntime
from llmbus.bus.tail import TopicTail
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import ModelSpec
from llmbus.settings import BusSettings
from llmbus_services.gateway.adapters.catalog import ModelCatalog


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[AIOKafkaConsumer]:
    """Every consumer the code under test makes."""
    made: list[AIOKafkaConsumer] = []

    class Recorded(AIOKafkaConsumer):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    for module in (tables, bus_consumer):
        monkeypatch.setattr(module, "AIOKafkaConsumer", Recorded)
    monkeypatch.setattr("llmbus.bus.tail.AIOKafkaConsumer", Recorded)
    return made


@pytest.fixture
def nobody() -> BusSettings:
    return BusSettings(kafka_bootstrap=f"127.0.0.1:{unused_port()}", admin_timeout_s=2, stop_timeout_s=2)


async def test_a_topic_tail_that_cannot_start_is_stopped(made: list[AIOKafkaConsumer], nobody: BusSettings) -> None:
    with pytest.raises(Exception):  # noqa: B017 - aiokafka's connection error or the timeout, either is a failure
        await TopicTail(nobody, "t.llm.results").start()
    assert [c._closed for c in made] == [True]


async def test_reading_a_table_with_no_broker_leaves_no_consumer_open(
    made: list[AIOKafkaConsumer], nobody: BusSettings
) -> None:
    with pytest.raises(Exception):  # noqa: B017
        await tables.read_log(nobody, "t.llm.models", ModelSpec)
    assert [c._closed for c in made] == [True]


async def test_a_runtime_whose_consumers_cannot_start_stops_everything_it_started(
    made: list[AIOKafkaConsumer], nobody: BusSettings
) -> None:
    """The gateway's catalog, followed by the runtime: no broker, so its start fails; every consumer
    is closed, the clean-ups run (last first) and the producer side is closed too."""
    publisher = MemoryPublisher(MemoryLog(), t.GATEWAY)
    runtime = ServiceRuntime(Bus(nobody, t.GATEWAY, t.Topics("t."), publisher), contracts.GATEWAY)
    catalog = ModelCatalog(30)
    runtime.subscribe("models", catalog.on_model)
    runtime.subscribe("workers", catalog.on_worker)
    cleaned: list[str] = []

    async def first() -> None:
        cleaned.append("first")

    async def second() -> None:
        cleaned.append("second")

    runtime.on_stop(first)
    runtime.on_stop(second)
    with pytest.raises(Exception):  # noqa: B017
        await runtime.start()
    assert [c._closed for c in made] == [True]  # the followed topics share one consumer
    assert cleaned == ["second", "first"] and runtime.failed and not runtime.ready.is_set()
