"""Records held open by a handler (llmbus.bus.holds): the commit point waits for their release."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord, TopicPartition

from llmbus.bus.consumer import ConsumerLoop
from llmbus.bus.holds import Holds
from llmbus.settings import BusSettings

TP = TopicPartition("llm.results", 0)


def record(offset: int) -> ConsumerRecord:
    return ConsumerRecord(TP.topic, TP.partition, offset, 0, 0, None, b"v", None, 0, 1, [])


async def unused(*_: object) -> None:
    raise AssertionError("not called")


def loop_with(holds: Holds[str]) -> ConsumerLoop:
    return ConsumerLoop(None, unused, unused, BusSettings(), service="test", holds=holds)  # type: ignore[arg-type]


def handled(loop: ConsumerLoop, offsets: range, ok: bool = True) -> None:
    """The handler ran on these records (started in offset order, as the loop starts them)."""
    for offset in offsets:
        loop._tracker.started(TP, offset)
    for offset in offsets:
        loop._finished(TP, offset, 0, ok)


def test_the_commit_point_stays_at_a_held_record_until_it_is_released() -> None:
    holds: Holds[str] = Holds()
    loop = loop_with(holds)
    holds.hold(record(1), "held")
    handled(loop, range(4))
    assert loop._tracker.to_commit() == {TP: 1}  # record 0 done; 1 held; 2, 3 done behind it
    assert [(tp, offset, v) for tp, offset, v in holds.items()] == [(TP, 1, "held")]
    holds.release(TP, 1)
    assert loop._tracker.to_commit() == {TP: 4}
    assert len(holds) == 0


def test_a_revoked_partition_drops_its_holds_and_a_late_release_does_nothing() -> None:
    holds: Holds[str] = Holds()
    loop = loop_with(holds)
    holds.hold(record(0), "held")
    handled(loop, range(2))
    loop._forget([TP])
    assert len(holds) == 0
    holds.hold(record(0), "again")  # a release for an offset of the old assignment is no-op
    holds.release(TP, 0)
    assert loop._tracker.to_commit() == {}


def test_a_record_dead_lettered_after_a_failed_attempt_held_it_is_done() -> None:
    holds: Holds[str] = Holds()
    loop = loop_with(holds)
    holds.hold(record(0), "held by the failed attempt")
    handled(loop, range(1), ok=False)
    assert loop._tracker.to_commit() == {TP: 1}
    assert len(holds) == 0
