"""A private 3-broker KRaft cluster, secured as deployed (SASL/SCRAM, the generated ACLs), replication 3,
min.insync.replicas 2 (tests/fixtures/kafka_cluster.py); router, scheduler, two sim workers and
cost-accounting on it with the shipped settings (a worker is dead after 5 s without a heartbeat, group
sessions of 10 s). At 40 % of the load the broker leading the busiest partitions is SIGKILLed; it is
started again 10 s later while the load keeps going.

One broker of three lost is no dependency down: every partition keeps two in-sync replicas, so acks=all
writes go on as soon as the controller has moved the dead broker's leaderships (its heartbeat session,
6 s). Clients only see latency: no error result of any code, every result billed once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from llmbus.bus.admin import open_admin
from llmbus.bus.security import kafka_auth
from llmbus.contract import topics as t
from llmbus.settings import BusSettings
from llmbus_tools.harness.reliability.deployment import TENANTS
from llmbus_tools.harness.reliability.load import Load
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.fixtures.kafka_cluster import MIN_INSYNC_REPLICAS, REPLICATION_FACTOR, kafka_cluster
from tests.reliability.common import Faults, Run, Scenario, at, deployed, run_scenario

# Plus every llm.dispatch.<worker> topic. The tenants' reply topics carry the streamed chunks (workers send
# them without waiting for each ack): the victim must lead some of them, so a stream meets the leader change.
BUSY = (t.ROUTED, t.RESULTS)
# How long the killed broker stays down before it is started again: past its heartbeat session
# (broker.session.timeout.ms, 6 s), so the controller has fenced it and moved its leaderships.
DOWN_S = 10
LOAD_S = 20  # the load is spread over at least this long, so it runs through the kill and the restart


async def leader_load(admin: BusSettings, reply_topics: list[str]) -> tuple[Counter[int], dict[str, object]]:
    """Records per leading broker over the busy topics' partitions (end offsets now), and the layout
    seen: partitions, the smallest ISR, and which brokers lead the reply topics' partitions."""
    topics = t.Topics(admin.topic_prefix)
    async with open_admin(admin) as client:
        names = await asyncio.wait_for(client.list_topics(), admin.admin_timeout_s)
        busy = [topics.name(n) for n in BUSY] + reply_topics
        busy += [n for n in names if n.startswith(topics.name(t.DISPATCH_PREFIX))]
        described = await asyncio.wait_for(client.describe_topics(busy), admin.admin_timeout_s)
    leaders = {TopicPartition(d["topic"], p["partition"]): p["leader"] for d in described for p in d["partitions"]}
    smallest_isr = min((len(p["isr"]) for d in described for p in d["partitions"]), default=0)
    reply_leaders = sorted({leader for tp, leader in leaders.items() if tp.topic in reply_topics})
    consumer = AIOKafkaConsumer(
        bootstrap_servers=admin.kafka_bootstrap, group_id=None, enable_auto_commit=False, **kafka_auth(admin)
    )
    try:
        await asyncio.wait_for(consumer.start(), admin.admin_timeout_s)
        ends = await asyncio.wait_for(consumer.end_offsets(list(leaders)), admin.admin_timeout_s)
    finally:
        await asyncio.wait_for(consumer.stop(), admin.admin_timeout_s)
    load: Counter[int] = Counter()
    for tp, leader in leaders.items():
        load[leader] += ends.get(tp, 0)
    return load, {"partitions": len(leaders), "smallest_isr": smallest_isr, "reply_leaders": reply_leaders}


async def run(run: Run) -> Outcome:
    with kafka_cluster(run.log_dir / "kafka-cluster", tenants=TENANTS) as cluster:
        deployment = run.deployment(
            cluster.secured, replication_factor=REPLICATION_FACTOR, min_insync_replicas=MIN_INSYNC_REPLICAS
        )
        faults = Faults()
        size = run.size
        load = Load(deployment, size.requests, min(size.rate_per_s, size.requests / LOAD_S))
        replies = [deployment.reply_topic(tenant) for tenant in deployment.tenants]

        def kill_busiest_leader() -> Callable[[], Awaitable[None]]:
            async def action() -> None:
                per_leader, layout = await leader_load(deployment.admin, replies)
                victim = per_leader.most_common(1)[0][0]
                faults.note(f"records by leading broker {dict(per_leader)} over {layout}; SIGKILL broker {victim}")
                if victim not in layout["reply_leaders"]:  # type: ignore[operator]
                    faults.problems.append(f"broker {victim} led no reply topic: no stream met the failover")
                await asyncio.to_thread(cluster.kill, victim)
                sent_at_kill = len(load.sent_ids)
                await asyncio.sleep(DOWN_S)
                per_leader, layout = await leader_load(deployment.admin, replies)  # leaderships moved, ISRs 2
                faults.note(f"broker {victim} down: records by leading broker {dict(per_leader)}, {layout}")
                if per_leader.get(victim) or layout["smallest_isr"] != MIN_INSYNC_REPLICAS:
                    faults.problems.append(f"broker {victim} down but leaderships/ISRs did not move: {layout}")
                await asyncio.to_thread(cluster.restart, victim)
                during = len(load.sent_ids) - sent_at_kill
                faults.note(f"broker {victim} started again after {DOWN_S} s down; {during} requests sent meanwhile")
                if during == 0:
                    faults.problems.append("no request was sent while the broker was down: the scenario tested nothing")

            return action

        # The cluster (and the namespace with it) goes away with the fixture: nothing to drop.
        async with deployed(deployment, run.log_dir, keep_namespace=True) as running:
            hooks = {at(size, 0.4): faults.spawn(kill_busiest_leader())}
            return await run_scenario("leader_sigkill", running, size, hooks, faults, ErrorBudget(), load)


SCENARIO = Scenario(
    "leader_sigkill",
    run,
    "on a secured 3-broker cluster, the busiest partitions' leader SIGKILLed, back 10 s later",
    heavy=True,
    own_broker=True,
    short_timeout_s=900,
)
