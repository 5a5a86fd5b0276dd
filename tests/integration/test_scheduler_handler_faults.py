"""Scheduler handlers when Redis or Kafka fail mid-request, and when a rebalance takes a partition
(real Redis for claims and markers; the publisher is a recording fake so failures can be injected)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import redis.asyncio as redis
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import ConsumerRecord
from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

from llmbus.contract.messages import (
    Dispatch,
    ErrorCode,
    ErrorInfo,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
    TokenChunk,
    WorkerState,
    WorkerStatus,
    now_ms,
)
from llmbus.contract.request_key import request_key
from llmbus.contract.topics import Topics
from llmbus.settings import BusSettings
from llmbus.state.store import dispatch_markers
from llmbus_services.scheduler.adapters.store import PlacementStore
from llmbus_services.scheduler.app import build_core
from llmbus_services.scheduler.config import SchedulerSettings
from llmbus_services.scheduler.core.scheduler import FinalError
from llmbus_services.scheduler.core.types import SchedRequest
from llmbus_services.scheduler.flows import SchedulerHandlers
from llmbus_services.scheduler.flows.placement import RETRY_PLACE_MS
from tests.support import redis_keys, until

pytestmark = pytest.mark.redis
PREFIX = "x."


@dataclass
class FlakyPublisher:
    """Records what is published; the next `fail_next` publishes to a topic containing `fail_on` raise."""

    sent: list[tuple[str, object]] = field(default_factory=list)
    fail_on: str = ""
    fail_next: int = 0
    error: Exception = field(default_factory=lambda: TimeoutError("publish timed out"))

    async def publish(self, topic: str, value: object, **_: object) -> None:
        if self.fail_next and self.fail_on in topic:
            self.fail_next -= 1
            raise self.error
        self.sent.append((topic, value))

    def of(self, kind: type) -> list:  # type: ignore[type-arg]
        return [v for _, v in self.sent if isinstance(v, kind)]


@dataclass
class FakeBus:
    publisher: FlakyPublisher
    topics: Topics = field(default_factory=lambda: Topics(PREFIX))
    service: str = "scheduler"
    dead_letters: list[ConsumerRecord] = field(default_factory=list)
    settings: BusSettings = field(default_factory=BusSettings)

    async def dead_letter(self, record: ConsumerRecord, exc: Exception) -> None:
        self.dead_letters.append(record)


@pytest.fixture
async def namespace(client: redis.Redis) -> AsyncIterator[str]:
    ns = f"t{uuid.uuid4().hex[:10]}."
    yield ns
    keys = await redis_keys(client, f"llmbus:{ns}*")
    if keys:
        await client.delete(*keys)


def make_handlers(client: redis.Redis, namespace: str, instance: str = "s1") -> SchedulerHandlers:
    settings = SchedulerSettings(instance_id=instance, heartbeat_stale_s=60)
    store = PlacementStore(client, f"{namespace}scheduler", instance)
    return SchedulerHandlers(
        FakeBus(FlakyPublisher()),  # type: ignore[arg-type]
        settings,
        build_core(settings),
        store,
        dispatch_markers(client, namespace, 3600),
    )


def routed_record(request_id: str, partition: int = 0, deadline_ms: int | None = None) -> ConsumerRecord:
    request = InferenceRequest(request_id=request_id, prompt="hello", max_tokens=8, deadline_ms=deadline_ms)
    raw = RoutedRequest(request=request, model="m").to_bytes()
    return ConsumerRecord(f"{PREFIX}llm.routed", partition, 0, 0, 0, b"m", raw, None, 1, len(raw), [])


async def heartbeat(handlers: SchedulerHandlers, worker_id: str = "w1", state: WorkerState = WorkerState.READY) -> None:
    """`worker_id`'s heartbeat read by the scheduler (READY: a worker of model m it may place on; STOPPED: gone)."""
    status = WorkerStatus(
        worker_id=worker_id,
        node_id="n1",
        state=state,
        engine="sim",
        models=["m"],
        max_model_len=8192,
        kv_blocks_total=1000,
        kv_blocks_free=1000,
    )
    raw, topic = status.to_bytes(), handlers.bus.topics.name("llm.workers")
    await handlers.on_fleet(ConsumerRecord(topic, 0, 0, 0, 0, None, raw, None, 0, len(raw), []))


def publisher(handlers: SchedulerHandlers) -> FlakyPublisher:
    return handlers.bus.publisher  # type: ignore[return-value]


async def deferred_errors_settled(handlers: SchedulerHandlers, timeout_s: float = 10) -> None:
    """Wait until every final error put off for a pending claim has been tried again to its end (sent or
    dropped): the sentinel a negative check needs, where a fixed window would miss a slower defect."""
    assert handlers._later, "a final error was put off for the pending claim"
    deadline = asyncio.get_running_loop().time() + timeout_s
    while handlers._later:  # a retry that finds the claim still pending puts itself off again
        await asyncio.wait_for(asyncio.gather(*handlers._later), max(0.0, deadline - asyncio.get_running_loop().time()))


def fail_once(handlers: SchedulerHandlers, failing: str, error: Exception) -> None:
    """The next placement claim (Redis) or Dispatch (Kafka) raises `error`, once."""
    if failing == "redis-claim":
        real_claim = handlers.store.claim

        async def claim_fails_once(placement):  # type: ignore[no-untyped-def]
            handlers.store.claim = real_claim  # type: ignore[method-assign]
            raise error

        handlers.store.claim = claim_fails_once  # type: ignore[method-assign]
    else:
        publisher(handlers).fail_on, publisher(handlers).fail_next, publisher(handlers).error = "llm.dispatch", 1, error


TRANSIENT = {
    "redis-claim": [
        ConnectionError("redis: connection reset"),
        OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        ReadOnlyError("You can't write against a read only replica."),
    ],
    "kafka-dispatch": [TimeoutError("publish timed out"), KafkaConnectionError()],
}


@pytest.mark.parametrize(
    ("failing", "error"), [(f, e) for f, errors in TRANSIENT.items() for e in errors], ids=lambda v: type(v).__name__
)
async def test_a_transient_failure_of_a_claim_or_dispatch_is_rolled_back_and_placed_again_not_answered(
    client: redis.Redis, namespace: str, failing: str, error: Exception
) -> None:
    handlers = make_handlers(client, namespace)
    await heartbeat(handlers)
    fail_once(handlers, failing, error)
    handling = asyncio.create_task(handlers.on_routed(routed_record("r1")))
    key = request_key("default", "r1")
    await until(lambda: key in handlers.core.delayed)  # rolled back, to be placed again
    assert not handling.done()  # its record stays open (uncommitted) meanwhile
    assert publisher(handlers).of(InferenceResult) == []  # nobody told the client it failed
    assert handlers.core.fleet.workers["w1"].inflight_count == 0  # no phantom placement
    await handlers._publish(handlers.core.tick(now_ms() + RETRY_PLACE_MS))
    await asyncio.wait_for(handling, 5)
    assert [d.request_id for d in publisher(handlers).of(Dispatch)] == ["r1"]
    assert publisher(handlers).of(InferenceResult) == []
    assert await client.get(handlers.store.key(key, 1)) is not None


@pytest.mark.parametrize(
    ("failing", "error"),
    [("redis-claim", ResponseError("WRONGTYPE Operation against a key")), ("kafka-dispatch", ValueError("a bug"))],
)
async def test_a_permanent_failure_of_a_claim_or_dispatch_is_rolled_back_and_answered(
    client: redis.Redis, namespace: str, failing: str, error: Exception
) -> None:
    handlers = make_handlers(client, namespace)
    await heartbeat(handlers)
    fail_once(handlers, failing, error)
    await asyncio.wait_for(handlers.on_routed(routed_record("r1")), 5)
    # The client is answered: final chunk on its reply topic and one error result.
    [result] = publisher(handlers).of(InferenceResult)
    assert result.status == ResultStatus.ERROR and result.error is not None
    assert result.error.code == ErrorCode.INTERNAL and result.error.retryable
    assert [c for c in publisher(handlers).of(TokenChunk) if c.final]
    # Core state rolled back: no phantom placement counted against the worker, nothing held.
    assert handlers.core.fleet.placement_of(request_key("default", "r1")) is None
    assert handlers.core.fleet.workers["w1"].inflight_count == 0
    assert await client.get(handlers.store.key(request_key("default", "r1"), 1)) is None
    # A later delivery of the same request id is placed, not ignored as "already held".
    await asyncio.wait_for(handlers.on_routed(routed_record("r1")), 5)
    assert [d.request_id for d in publisher(handlers).of(Dispatch)] == ["r1"]


async def test_a_handler_exception_dead_letters_and_answers_the_client(client: redis.Redis, namespace: str) -> None:
    handlers = make_handlers(client, namespace)
    record = routed_record("r2")
    await handlers.on_routed_error(record, RuntimeError("bug"))
    assert handlers.bus.dead_letters == [record]  # type: ignore[attr-defined]
    [result] = publisher(handlers).of(InferenceResult)
    assert result.request_id == "r2" and result.error is not None and result.error.code == ErrorCode.INTERNAL
    assert [c.final for c in publisher(handlers).of(TokenChunk)] == [True]


async def test_revoked_partitions_are_handed_over_and_the_old_owner_never_answers(
    client: redis.Redis, namespace: str
) -> None:
    old = make_handlers(client, namespace, "old-owner")
    new = make_handlers(client, namespace, "new-owner")
    # No worker yet: on the old owner the request waits (its record open), with a short deadline.
    waiting = asyncio.create_task(old.on_routed(routed_record("r3", partition=0, deadline_ms=now_ms() + 300)))
    other = asyncio.create_task(old.on_routed(routed_record("r4", partition=1)))
    await until(
        lambda: (
            old.core.queues.holds("m", request_key("default", "r3"))
            and old.core.queues.holds("m", request_key("default", "r4"))
        )
    )
    assert not waiting.done()
    # Rebalance: partition 0 goes to the new owner, which places r3 (attempt 1, its own claim).
    assert old.hand_over({TopicPartition(f"{PREFIX}llm.routed", 0)}) == 1
    with pytest.raises(asyncio.CancelledError):
        await waiting  # cancelled, so its offset stays uncommitted for the new owner
    assert not other.done() and old.core.queues.holds("m", request_key("default", "r4"))  # partition 1 stays here
    await heartbeat(new)
    await asyncio.wait_for(new.on_routed(routed_record("r3", partition=0)), 5)
    assert await client.get(new.store.key(request_key("default", "r3"), 1)) is not None
    # Past r3's deadline the old owner's timer finds nothing of r3: no DEADLINE_EXCEEDED, claim intact.
    # (The timer is told the time: 400 ms on, past the 300 ms deadline, without waiting for it.)
    await old._publish(old.core.tick(now_ms() + 400))
    assert not [r for r in publisher(old).of(InferenceResult) if r.request_id == "r3"]
    assert await client.get(new.store.key(request_key("default", "r3"), 1)) is not None
    other.cancel()


async def test_a_final_error_waits_for_a_pending_claim_instead_of_leaving_the_request_unanswered(
    client: redis.Redis, namespace: str
) -> None:
    """An attempt claimed the result and then died before publishing it: when the scheduler gives
    up on the request (max attempts, deadline) it must answer once that claim's lease is over,
    not take the claim for a published result."""
    handlers = make_handlers(client, namespace)
    handlers.fence.claim_lease_ms = 300
    assert await handlers.fence.claim_final("default:r5", 1)  # the attempt's claim, never published
    request = SchedRequest.from_routed(RoutedRequest.model_validate_json(routed_record("r5").value), now_ms(), 16, 0)
    async with handlers._lock:
        await handlers._fail(FinalError(request, ErrorInfo.of(ErrorCode.MAX_ATTEMPTS, "3 attempts failed")))
    assert not publisher(handlers).of(InferenceResult)  # the attempt may still publish within its lease
    await deferred_errors_settled(handlers)
    [result] = publisher(handlers).of(InferenceResult)
    assert result.error is not None and result.error.code == ErrorCode.MAX_ATTEMPTS
    assert await handlers.fence.holder("default:r5") == "done:scheduler"


async def test_a_final_error_is_dropped_when_the_pending_attempt_publishes_meanwhile(
    client: redis.Redis, namespace: str
) -> None:
    handlers = make_handlers(client, namespace)
    handlers.fence.claim_lease_ms = 300
    assert await handlers.fence.claim_final("default:r6", 1)
    request = SchedRequest.from_routed(RoutedRequest.model_validate_json(routed_record("r6").value), now_ms(), 16, 0)
    async with handlers._lock:
        await handlers._fail(FinalError(request, ErrorInfo.of(ErrorCode.MAX_ATTEMPTS, "3 attempts failed")))
    await handlers.fence.final_published("default:r6", 1)  # the attempt's result went out after all
    await deferred_errors_settled(handlers)
    assert not publisher(handlers).of(InferenceResult)


async def test_the_next_request_is_placed_while_a_dispatch_awaits_its_ack(client: redis.Redis, namespace: str) -> None:
    """The lock covers decisions and claims, not the broker's ack: a slow ack does not hold up the
    next placement, and the request's record is resolved (committable) only once its ack is in."""
    handlers = make_handlers(client, namespace)
    await heartbeat(handlers)
    ack = asyncio.Event()
    real_publish = publisher(handlers).publish

    awaiting_ack = asyncio.Event()

    async def slow_first_dispatch(topic: str, value: object, **kw: object) -> None:
        if isinstance(value, Dispatch) and value.request_id == "slow":
            awaiting_ack.set()
            await ack.wait()
        await real_publish(topic, value, **kw)

    publisher(handlers).publish = slow_first_dispatch  # type: ignore[method-assign]
    slow = asyncio.create_task(handlers.on_routed(routed_record("slow")))
    await asyncio.wait_for(awaiting_ack.wait(), 5)
    await asyncio.wait_for(handlers.on_routed(routed_record("fast", partition=1)), 5)
    assert [d.request_id for d in publisher(handlers).of(Dispatch)] == ["fast"]
    assert not slow.done(), "its record stays open until its Dispatch is acknowledged"
    ack.set()
    await asyncio.wait_for(slow, 5)
    assert sorted(d.request_id for d in publisher(handlers).of(Dispatch)) == ["fast", "slow"]
    assert not publisher(handlers).of(InferenceResult)


async def test_the_next_request_is_placed_while_a_first_attempts_claim_is_at_redis(
    client: redis.Redis, namespace: str
) -> None:
    """A first attempt is claimed outside the lock: a slow claim does not hold up the next placement
    (placements decided close together share a Redis round trip), and its record stays open until
    its claim and Dispatch are through."""
    handlers = make_handlers(client, namespace)
    await heartbeat(handlers)
    claimed = asyncio.Event()
    real_claim = handlers.store.claim

    at_redis = asyncio.Event()

    async def slow_first_claim(placement):  # type: ignore[no-untyped-def]
        if placement.request_id == "slow":
            at_redis.set()
            await claimed.wait()
        return await real_claim(placement)

    handlers.store.claim = slow_first_claim  # type: ignore[method-assign]
    slow = asyncio.create_task(handlers.on_routed(routed_record("slow")))
    await asyncio.wait_for(at_redis.wait(), 5)
    await asyncio.wait_for(handlers.on_routed(routed_record("fast", partition=1)), 5)
    assert [d.request_id for d in publisher(handlers).of(Dispatch)] == ["fast"]
    assert handlers.core.fleet.placement_of(request_key("default", "slow")) is not None, (
        "counted on its worker while it is claimed"
    )
    assert not slow.done(), "its record stays open until its claim and Dispatch are through"
    claimed.set()
    await asyncio.wait_for(slow, 5)
    assert sorted(d.request_id for d in publisher(handlers).of(Dispatch)) == ["fast", "slow"]
    assert await client.get(handlers.store.key(request_key("default", "slow"), 1)) is not None


async def test_a_first_attempt_another_instance_claimed_is_forgotten_without_an_answer(
    client: redis.Redis, namespace: str
) -> None:
    """The claim lost to another instance (a rebalance delivered the record to both): this one sends
    nothing, answers nothing, counts nothing, and its record is done."""
    handlers = make_handlers(client, namespace)
    await heartbeat(handlers)
    await client.set(handlers.store.key(request_key("default", "r1"), 1), '{"instance": "s2"}')
    await asyncio.wait_for(handlers.on_routed(routed_record("r1")), 5)
    assert not publisher(handlers).of(Dispatch) and not publisher(handlers).of(InferenceResult)
    assert handlers.core.fleet.placement_of(request_key("default", "r1")) is None
    assert handlers.core.fleet.workers["w1"].inflight_count == 0
    assert "s2" in str(await client.get(handlers.store.key(request_key("default", "r1"), 1))), (
        "the winner's claim is left alone"
    )


async def test_final_errors_go_out_together_outside_the_lock(client: redis.Redis, namespace: str) -> None:
    """A tick that expires a full queue answers every request at once, and the lock is free meanwhile:
    one at a time under it, each error waited for its Redis round trips and its Kafka ack (~250 ms
    each after a leader failover), and heartbeats, outcomes and new requests waited minutes."""
    handlers = make_handlers(client, namespace)
    ack_s = 0.2
    slow = publisher(handlers)
    record_sent = slow.publish

    async def acked_late(topic: str, value: object, **kwargs: object) -> None:
        await asyncio.sleep(ack_s)
        await record_sent(topic, value, **kwargs)

    slow.publish = acked_late  # type: ignore[method-assign]
    expired = [
        FinalError(
            SchedRequest.from_routed(RoutedRequest.model_validate_json(routed_record(f"q{i}").value), now_ms(), 16, 0),
            ErrorInfo.of(ErrorCode.DEADLINE_EXCEEDED, "expired in the queue"),
        )
        for i in range(20)
    ]
    clock = asyncio.get_running_loop().time
    started = clock()
    async with handlers._lock:
        await handlers._publish(list(expired))
    locked_s = clock() - started
    await asyncio.wait_for(asyncio.gather(*handlers._later), 30)
    took_s = clock() - started
    assert sorted(r.request_id for r in slow.of(InferenceResult)) == sorted(f"q{i}" for i in range(20))
    assert locked_s < ack_s, f"the lock was held {locked_s:.2f} s while the errors were sent"
    assert took_s < 10 * ack_s, f"{took_s:.2f} s for 20 errors: sent one after another"
