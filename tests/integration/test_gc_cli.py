"""`llmbus gc` on the real broker and Redis: a worker and a gateway silent for longer than the
retention lose their topic, groups, llm.workers key and ledger keys; live ones keep everything;
`--dry-run` only lists."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from typer.testing import CliRunner

from llmbus.bus.admin import ensure_topics, open_admin
from llmbus.bus.tables import read_table
from llmbus.cli.gc import delete_groups
from llmbus.cli.main import app
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import WorkerState, WorkerStatus
from llmbus.settings import BusSettings
from llmbus.state.keys import cost_key_root
from llmbus.state.store import redis_client
from tests.support import eventually

pytestmark = [pytest.mark.kafka]

HOUR_MS = 3_600_000


async def _gc(settings: BusSettings, *args: str) -> str:
    env = {"LLMBUS_TOPIC_PREFIX": settings.topic_prefix, "COLUMNS": "250"}
    result = await asyncio.to_thread(CliRunner().invoke, app, ["gc", *args], env=env)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


async def _topics(settings: BusSettings) -> set[str]:
    async with open_admin(settings) as admin:
        return set(await admin.list_topics())


async def _groups(settings: BusSettings) -> set[str]:
    async with open_admin(settings) as admin:
        return {g[0] for g in await admin.list_consumer_groups()}


async def _make_group(settings: BusSettings, group: str, topic: str) -> None:
    """A consumer group with a committed offset, as a worker's consumer leaves it."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.commit({tp: 0})
    finally:
        await consumer.stop()


async def test_gc_removes_only_what_gone_instances_left(bus_settings: BusSettings) -> None:
    s = bus_settings
    topics = t.Topics(s.topic_prefix)
    now_ms = int(time.time() * 1000)
    old_ms = now_ms - 3 * HOUR_MS  # silent 3 h; the retention below is 1 h
    dispatch = {w: topics.dispatch(w) for w in ("w-live", "w-gone")}
    replies = {g: topics.replies(g) for g in ("gw-live", "gw-gone")}
    await ensure_topics(
        s,
        [(name, t.DISPATCH_SPEC) for name in dispatch.values()] + [(name, t.REPLIES_SPEC) for name in replies.values()],
    )
    groups = {
        w: [contracts.WORKER.group_id(n, topics, worker_id=w) or "" for n in ("dispatch", "control")] for w in dispatch
    }
    for w, names in groups.items():
        for group in names:
            await _make_group(s, group, dispatch[w])
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for w, sent_ms in (("w-live", now_ms), ("w-gone", old_ms)):
            beat = WorkerStatus(worker_id=w, node_id="n", state=WorkerState.READY, engine="sim", sent_at_ms=sent_ms)
            await producer.send_and_wait(topics.name(t.WORKERS), beat.to_bytes(), key=w.encode())
        # A gateway publishes no heartbeat: its reply topic's last write is its sign of life.
        await producer.send_and_wait(replies["gw-live"], b"{}", key=b"r1", timestamp_ms=now_ms)
        await producer.send_and_wait(replies["gw-gone"], b"{}", key=b"r2", timestamp_ms=old_ms)
    finally:
        await producer.stop()
    redis = redis_client(s.redis_url)
    root = cost_key_root(s.topic_prefix)  # cost-accounting's keys
    await redis.set(f"{root}owner:w-live", "r1")
    await redis.set(f"{root}owner:w-gone", "r1")
    await redis.hset(f"{root}cursor", mapping={"w-live": "{}", "w-gone": "{}"})
    try:
        listed = await _gc(s, "--older-than", "1h", "--dry-run")
        assert "w-gone" in listed and "gw-gone" in listed, listed
        assert "w-live" not in listed and "gw-live" not in listed, listed
        present = await _topics(s)
        assert set(dispatch.values()) | set(replies.values()) <= present  # dry run: nothing removed
        assert {g for names in groups.values() for g in names} <= await _groups(s)
        assert set(await read_table(s, topics.name(t.WORKERS), WorkerStatus)) == {"w-live", "w-gone"}
        assert await redis.exists(f"{root}owner:w-gone") == 1

        await _gc(s, "--older-than", "1h")

        async def gone_topics_deleted() -> bool:
            left = await _topics(s)
            return dispatch["w-gone"] not in left and replies["gw-gone"] not in left

        await eventually(gone_topics_deleted, timeout_s=30)
        left = await _topics(s)
        assert dispatch["w-live"] in left and replies["gw-live"] in left
        now_groups = await _groups(s)
        assert not set(groups["w-gone"]) & now_groups
        assert set(groups["w-live"]) <= now_groups
        assert set(await read_table(s, topics.name(t.WORKERS), WorkerStatus)) == {"w-live"}  # tombstoned
        assert await redis.exists(f"{root}owner:w-gone") == 0
        assert await redis.exists(f"{root}owner:w-live") == 1
        assert set(await redis.hkeys(f"{root}cursor")) == {b"w-live"}

        assert "nothing gone" in await _gc(s, "--older-than", "1h")  # a second run finds nothing
    finally:
        await redis.delete(f"{root}owner:w-live", f"{root}owner:w-gone", f"{root}cursor")
        await redis.aclose()
        await delete_groups(s, [g for names in groups.values() for g in names])


async def test_gc_keeps_a_group_that_has_members_again(bus_settings: BusSettings) -> None:
    """A worker silent past the retention whose consumer group has a live member again (the same
    worker id came back, or another process consumes as it): the broker refuses to delete the
    group, and `llmbus gc` keeps it and says so instead of failing; the topic of the gone worker
    still goes."""
    s = bus_settings
    topics = t.Topics(s.topic_prefix)
    worker = "w-back"
    dispatch = topics.dispatch(worker)
    await ensure_topics(s, [(dispatch, t.DISPATCH_SPEC)])
    busy_group, idle_group = (
        contracts.WORKER.group_id(n, topics, worker_id=worker) or "" for n in ("dispatch", "control")
    )
    await _make_group(s, idle_group, dispatch)
    member = AIOKafkaConsumer(
        topics.name(t.WORKERS), bootstrap_servers=s.kafka_bootstrap, group_id=busy_group, enable_auto_commit=False
    )
    await member.start()
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap, acks="all")
    await producer.start()
    try:

        async def joined() -> bool:
            await member.getmany(timeout_ms=200)
            return bool(member.assignment())

        await eventually(joined, timeout_s=30)
        old = WorkerStatus(
            worker_id=worker,
            node_id="n",
            state=WorkerState.READY,
            engine="sim",
            sent_at_ms=int(time.time() * 1000) - 3 * HOUR_MS,
        )
        await producer.send_and_wait(topics.name(t.WORKERS), old.to_bytes(), key=worker.encode())

        assert await delete_groups(s, [busy_group]) == [busy_group]  # the broker refuses: members
        output = await _gc(s, "--older-than", "1h")
        # the console wraps long lines at its width: compare with the whitespace folded
        assert f"kept consumer group {busy_group}: it has members again" in " ".join(output.split()), output
        groups = await _groups(s)
        assert busy_group in groups, "a group with members was deleted"
        assert idle_group not in groups, "the gone worker's empty group was kept"

        async def topic_deleted() -> bool:
            return dispatch not in await _topics(s)

        await eventually(topic_deleted, timeout_s=30)
    finally:
        await producer.stop()
        await member.stop()
        await delete_groups(s, [busy_group, idle_group])
