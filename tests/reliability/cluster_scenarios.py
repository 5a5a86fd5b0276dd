"""Fault scenarios on a replicated broker: a private 3-broker KRaft cluster (`tests.fixtures.kafka_cluster`,
replication 3, min.insync.replicas 2), the leader of the busiest partitions SIGKILLed mid-run.

One broker of three lost is no dependency down: every partition keeps two in-sync replicas, so
acks=all writes go on as soon as the controller has moved the dead broker's leaderships (its
heartbeat session, 6 s). Clients only see latency, so the bound is 0 error results of any code.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from llmbus.bus.admin import open_admin
from llmbus.contract import topics as t
from llmbus.settings import BusSettings
from llmbus_tools.harness.reliability.effects import Billing
from llmbus_tools.harness.reliability.stack import Load, Outcome
from llmbus_tools.harness.service_procs import fresh_settings
from tests.fixtures.kafka_cluster import MIN_INSYNC_REPLICAS, REPLICATION_FACTOR, KafkaCluster, kafka_cluster
from tests.reliability.scenarios import NO_ERRORS, WORKERS, Faults, Size, at, run_scenario, running_stack
from tests.reliability.service_scenarios import rejoined

# Plus every llm.dispatch.<worker> topic. llm.tokens carries the streamed chunks (every load request
# streams), which workers send without waiting for each ack (Publisher.send): the victim must lead
# some of its partitions, so a stream meets the leader change.
BUSY = (t.ROUTED, t.RESULTS, t.TOKENS)
# How long the killed broker stays down before it is started again: past its heartbeat session
# (broker.session.timeout.ms, 6 s), so the controller has fenced it and moved its leaderships.
DOWN_S = 10
# A worker's heartbeats stall while llm.workers' leader fails over: the dead broker fenced after 6 s,
# then each producer finds the new leader on its own (measured: workers declared dead 13 and 19 s
# after the kill with the default 5 s, their running work placed again, attempts burnt, queues
# full). On a replicated cluster the liveness timeout must outlast a failover.
SCHEDULER_ENV = {"LLMBUS_SCHEDULER_HEARTBEAT_STALE_S": "20"}
# Every consumer's group session (LLMBUS_SESSION_TIMEOUT_MS, 10 s by default) at Kafka's own default
# since KIP-735, 45 s. Measured with 10 s (3 runs): coordinators that never moved dropped the router's
# and the scheduler's members on heartbeat expiration (the broker's log: "Member … has failed,
# removing it from the group"), 20-60 s after the kill and again ~50 s later, while the host ran at
# load 20-50 on two cores; each rejoin replayed the uncommitted tail (the scheduler handed back 217-232
# waiting requests), and its handling, as far as the logs show, delayed the next heartbeats past 10 s.
# Nothing here is SIGKILLed but a broker, so no dead member has to be waited out.
SESSION_TIMEOUT_MS = 45_000
LOAD_S = 20  # the load is spread over at least this long, so it runs through the kill and the restart


async def leader_load(settings: BusSettings) -> tuple[Counter[int], dict[str, object]]:
    """Records per leading broker over the busy topics' partitions (end offsets now), and the layout
    seen: partitions, the smallest ISR, and which brokers lead llm.tokens' partitions."""
    topics = t.Topics(settings.topic_prefix)
    async with open_admin(settings) as admin:
        names = await asyncio.wait_for(admin.list_topics(), settings.admin_timeout_s)
        busy = [topics.name(n) for n in BUSY] + [n for n in names if n.startswith(topics.name(t.DISPATCH_PREFIX))]
        described = await asyncio.wait_for(admin.describe_topics(busy), settings.admin_timeout_s)
    leaders = {TopicPartition(d["topic"], p["partition"]): p["leader"] for d in described for p in d["partitions"]}
    smallest_isr = min((len(p["isr"]) for d in described for p in d["partitions"]), default=0)
    tokens = topics.name(t.TOKENS)
    token_leaders = sorted(leader for tp, leader in leaders.items() if tp.topic == tokens)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None, enable_auto_commit=False)
    try:
        await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
        ends = await asyncio.wait_for(consumer.end_offsets(list(leaders)), settings.admin_timeout_s)
    finally:
        await asyncio.wait_for(consumer.stop(), settings.admin_timeout_s)
    load: Counter[int] = Counter()
    for tp, leader in leaders.items():
        load[leader] += ends.get(tp, 0)
    return load, {"partitions": len(leaders), "smallest_isr": smallest_isr, "token_leaders": token_leaders}


async def leader_sigkill(size: Size, log_dir: Path) -> Outcome:
    """3 brokers, RF 3, min.insync.replicas 2; router, scheduler, two sim workers and cost-accounting.
    At 40 % of the load the broker leading the busiest partitions (most records on llm.routed,
    llm.results and the dispatch topics) is SIGKILLed; it is started again DOWN_S later while the
    load keeps going. 0 lost, 0 doubled, 0 error results, every result billed once."""
    with kafka_cluster(log_dir / "kafka-cluster") as cluster:
        return await _leader_sigkill(cluster, size, log_dir)


async def _leader_sigkill(cluster: KafkaCluster, size: Size, log_dir: Path) -> Outcome:
    settings = fresh_settings(
        kafka_bootstrap=cluster.bootstrap,
        replication_factor=REPLICATION_FACTOR,
        min_insync_replicas=MIN_INSYNC_REPLICAS,
        session_timeout_ms=SESSION_TIMEOUT_MS,
    )
    faults = Faults()
    group = t.Topics(settings.topic_prefix).group(t.COST, "results")
    load = Load(settings, size.requests, min(size.rate_per_s, size.requests / LOAD_S))

    def kill_busiest_leader() -> Callable[[], Awaitable[None]]:
        async def action() -> None:
            per_leader, layout = await leader_load(settings)
            victim = per_leader.most_common(1)[0][0]
            faults.note(f"records by leading broker {dict(per_leader)} over {layout}; SIGKILL broker {victim}")
            if victim not in layout["token_leaders"]:  # type: ignore[operator]
                faults.problems.append(f"broker {victim} led no llm.tokens partition: no stream met the failover")
            await asyncio.to_thread(cluster.kill, victim)
            sent_at_kill = len(load.sent_ids)
            await asyncio.sleep(DOWN_S)
            per_leader, layout = await leader_load(settings)  # leaderships moved, ISRs shrunk to 2
            faults.note(f"broker {victim} down: records by leading broker {dict(per_leader)}, {layout}")
            if per_leader.get(victim) or layout["smallest_isr"] != MIN_INSYNC_REPLICAS:
                faults.problems.append(f"broker {victim} down but leaderships/ISRs did not move: {layout}")
            await asyncio.to_thread(cluster.restart, victim)
            during = len(load.sent_ids) - sent_at_kill
            faults.note(f"broker {victim} started again after {DOWN_S} s down; {during} requests sent meanwhile")
            if during == 0:
                faults.problems.append("no request was sent while the broker was down: the scenario tested nothing")

        return action

    async with running_stack(settings, log_dir, WORKERS, scheduler_env=SCHEDULER_ENV) as stack:
        stack.cost()
        await rejoined(settings, group, set())
        billing = await Billing(settings).start()
        try:
            hooks = {at(size, 0.4): faults.spawn(kill_busiest_leader())}
            outcome = await run_scenario(
                "leader_sigkill", settings, stack, size, hooks, faults, NO_ERRORS, load, effects=[billing]
            )
        finally:
            await billing.stop()
    outcome.effect_problems += faults.problems
    # The cluster (and the namespace with it) goes away with the fixture: nothing to drop.
    return outcome


CLUSTER_SCENARIOS: dict[str, Callable[[Size, Path], Awaitable[Outcome]]] = {"leader_sigkill": leader_sigkill}
