"""Tenants cannot see or steer each other, on a secured broker (SASL/SCRAM + catalog ACLs).

A private broker from deploy/kafka/kafka.sh (KAFKA_AUTH=scram), ACLs from `llmbus.security.acls`, and a
router, scheduler and sim worker each connected as its own principal. Tenants `acme` and
`globex` use nothing but a Kafka client and their own credentials.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
)

from llmbus.bus import decode, make_producer
from llmbus.bus.acl_admin import apply_acls
from llmbus.bus.admin import ensure_catalog, ensure_topics
from llmbus.bus.producer import stop_producer
from llmbus.bus.security import kafka_auth
from llmbus.client import LlmbusClient, TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Control,
    ControlAction,
    DeadLetter,
    ErrorCode,
    Feedback,
    InferenceRequest,
    InferenceResult,
    ModelSpec,
    ResultStatus,
    TokenChunk,
    WorkerState,
    WorkerStatus,
)
from llmbus.contract.request_key import request_key
from llmbus.security.acls import ANALYTICS, all_acls, tenant_topics
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_services.shadow_comparator.adapters.store import ComparatorStore
from llmbus_tools.harness.service_procs import ServiceProc, fresh_settings, wait_workers_ready
from llmbus_tools.router_training.feedback import read_feedback
from tests.fixtures.secured_kafka import TENANTS, SecuredKafka
from tests.support import eventually


async def fresh_namespace(secured_kafka: SecuredKafka) -> str:
    """A namespace on the secured broker with its catalog, the tenants' topics, worker w1's dispatch
    topic and the ACLs."""
    prefix = fresh_settings().topic_prefix
    admin = secured_kafka.settings("admin", prefix)
    await apply_acls(admin, all_acls(prefix, list(TENANTS)))
    await ensure_catalog(admin)
    topics = [(name, spec) for tenant in TENANTS for name, spec in tenant_topics(tenant)]
    topics.append(("llm.dispatch.w1", t.DISPATCH_SPEC))
    await ensure_topics(admin, [(t.Topics(prefix).name(name), spec) for name, spec in topics])
    return prefix


@pytest.fixture(scope="module")
async def prefix(secured_kafka: SecuredKafka) -> str:
    return await fresh_namespace(secured_kafka)


@pytest.fixture(scope="module")
async def stack(
    secured_kafka: SecuredKafka, prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[None]:
    """Router, scheduler and one sim worker, each as its own principal."""
    log_dir: Path = tmp_path_factory.mktemp("secured-stack")
    procs = [
        ServiceProc(
            "llmbus_services.router", secured_kafka.settings(t.ROUTER, prefix), secured_kafka.env(t.ROUTER), log_dir
        ),
        ServiceProc(
            "llmbus_services.scheduler",
            secured_kafka.settings(t.SCHEDULER, prefix),
            secured_kafka.env(t.SCHEDULER),
            log_dir,
        ),
        ServiceProc(
            "llmbus_services.engine_worker",
            secured_kafka.settings(t.WORKER, prefix),
            secured_kafka.env(t.WORKER) | {"LLMBUS_WORKER_WORKER_ID": "w1", "LLMBUS_WORKER_SIM_SPEEDUP": "50"},
            log_dir,
        ),
    ]
    for proc in procs:
        proc.start()
    try:
        await wait_workers_ready(secured_kafka.settings("operator", prefix), {"w1"}, timeout_s=120)
        yield
    except BaseException:
        for proc in procs:
            print(f"\n--- log of {proc.name} ---\n{proc.log_tail()}")
        raise
    finally:
        for proc in procs:
            proc.kill()


async def produce_as(secured_kafka: SecuredKafka, user: str, prefix: str, topic: str, value: object, key: str) -> None:
    await produce_as_with(secured_kafka.settings(user, prefix), topic, value, key)


async def produce_as_with(settings: BusSettings, topic: str, value: object, key: str) -> None:
    prefix = settings.topic_prefix
    producer = make_producer(settings, client_id=f"test-{settings.kafka_sasl_username}")
    try:
        await asyncio.wait_for(producer.start(), 30)
        payload = value.to_bytes() if hasattr(value, "to_bytes") else bytes(value)  # type: ignore[call-overload]
        await asyncio.wait_for(
            producer.send_and_wait(t.Topics(prefix).name(topic), payload, key=key.encode(), partition=0), 20
        )
    finally:
        await stop_producer(producer, 10)


async def read_as(secured_kafka: SecuredKafka, user: str, prefix: str, topic: str, seconds: float = 5) -> list[bytes]:
    """Fetch partition 0 of `topic` from the start as `user`: the values it got; raises
    TopicAuthorizationFailedError when the broker answered that `user` may not read it."""
    name = t.Topics(prefix).name(topic)
    consumer = AIOKafkaConsumer(
        group_id=None,
        auto_offset_reset="earliest",
        bootstrap_servers=secured_kafka.bootstrap,
        **kafka_auth(secured_kafka.settings(user, prefix)),
    )
    values: list[bytes] = []
    try:
        await asyncio.wait_for(consumer.start(), 30)
        consumer.assign([TopicPartition(name, 0)])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline and not values:
            # aiokafka keeps retrying a topic the broker refuses (and logs it) rather than raising it.
            if name in consumer._client.cluster.unauthorized_topics:
                raise TopicAuthorizationFailedError(name)
            for records in (await consumer.getmany(timeout_ms=500)).values():
                values += [r.value for r in records if r.value is not None]
        return values
    finally:
        await asyncio.wait_for(consumer.stop(), 10)


async def replies_of(secured_kafka: SecuredKafka, user: str, prefix: str, topic: str, request_id: str) -> TopicTail:
    tail = TopicTail(secured_kafka.settings(user, prefix), t.Topics(prefix).name(topic))
    return await tail.start()


async def final_chunk(tail: TopicTail, request_id: str, timeout_s: float = 60) -> TokenChunk:
    async for record in tail.records(timeout_s):
        if record.key == request_id.encode():  # type: ignore[attr-defined]
            chunk = decode(record, TokenChunk)  # type: ignore[arg-type]
            if chunk.final:
                return chunk
    raise TimeoutError(f"no final chunk for {request_id}")


@pytest.mark.parametrize(
    ("topic", "value"),
    [
        (t.RESULTS, InferenceRequest(prompt="junk")),
        ("llm.requests.globex", InferenceRequest(prompt="p", tenant="globex")),  # speaking as another tenant
        (t.REQUESTS, InferenceRequest(prompt="p", tenant="globex")),  # the gateway's topic
        (t.CONTROL, Control(action=ControlAction.CANCEL, target_id="someone-elses-request")),
        (t.MODELS, ModelSpec(name="evil", tier="strong")),
        (
            t.WORKERS,
            WorkerStatus(
                worker_id="w1", node_id="n", state=WorkerState.READY, engine="sim", dispatch_topic="llm.replies.acme"
            ),
        ),  # forged heartbeat
        ("llm.dispatch.w1", InferenceRequest(prompt="p")),
    ],
    ids=["results", "foreign-requests", "shared-requests", "control", "models", "workers-heartbeat", "dispatch"],
)
async def test_a_tenant_cannot_write_internal_or_foreign_topics(
    secured_kafka: SecuredKafka, prefix: str, topic: str, value: object
) -> None:
    with pytest.raises(TopicAuthorizationFailedError):
        await produce_as(secured_kafka, "tenant-acme", prefix, topic, value, key="k")


@pytest.mark.parametrize("topic", ["llm.replies.globex", "llm.replies.globex.laptop", t.TOKENS, t.RESULTS])
async def test_a_tenant_cannot_read_another_tenants_replies_or_shared_streams(
    secured_kafka: SecuredKafka, prefix: str, topic: str
) -> None:
    admin = secured_kafka.settings("admin", prefix)
    await ensure_topics(admin, [(t.Topics(prefix).name(topic), t.REPLIES_SPEC)])
    secret = TokenChunk(request_id="r", tenant="globex", seq=0, delta="globex's secret")
    await produce_as(secured_kafka, "admin", prefix, topic, secret, key="r")
    with pytest.raises(TopicAuthorizationFailedError):
        await read_as(secured_kafka, "tenant-acme", prefix, topic)
    if topic.startswith("llm.replies.globex"):  # the owner reads them: the refusal above is about who asks
        assert await read_as(secured_kafka, "tenant-globex", prefix, topic) == [secret.to_bytes()]


async def test_a_body_claiming_another_tenant_is_refused_with_a_clear_error(
    secured_kafka: SecuredKafka, prefix: str, stack: None
) -> None:
    tail = await replies_of(secured_kafka, "tenant-acme", prefix, "llm.replies.acme", "")
    try:
        rid = uuid.uuid4().hex
        claim = InferenceRequest(
            request_id=rid, prompt="bill globex", tenant="globex", model="sim-llama-8b", reply_topic="llm.replies.acme"
        )
        await produce_as(secured_kafka, "tenant-acme", prefix, "llm.requests.acme", claim, key=rid)
        chunk = await final_chunk(tail, rid)
    finally:
        await tail.stop()
    assert chunk.error is not None and chunk.error.code == ErrorCode.FORBIDDEN
    assert "claims tenant 'globex'" in chunk.error.message and chunk.tenant == "acme"


@pytest.mark.parametrize("reply_topic", ["llm.replies.globex", t.RESULTS, t.WORKERS, "llm.replies.nobody"])
async def test_a_reply_cannot_be_redirected_into_an_internal_or_foreign_topic(
    secured_kafka: SecuredKafka, prefix: str, stack: None, reply_topic: str
) -> None:
    own = await replies_of(secured_kafka, "tenant-acme", prefix, "llm.replies.acme", "")
    victim = await replies_of(secured_kafka, "operator", prefix, "llm.replies.globex", "")
    try:
        rid = uuid.uuid4().hex
        steer = InferenceRequest(
            request_id=rid, prompt="hi", tenant="acme", model="sim-llama-8b", max_tokens=8, reply_topic=reply_topic
        )
        await produce_as(secured_kafka, "tenant-acme", prefix, "llm.requests.acme", steer, key=rid)
        chunk = await final_chunk(own, rid)
        leaked = [r async for r in victim.records(1.0) if r.key == rid.encode()]  # type: ignore[attr-defined]
    finally:
        await own.stop()
        await victim.stop()
    assert chunk.error is not None and chunk.error.code == ErrorCode.FORBIDDEN, chunk
    assert reply_topic in chunk.error.message
    assert leaked == []


async def test_valid_traffic_of_each_tenant_still_flows(secured_kafka: SecuredKafka, prefix: str, stack: None) -> None:
    for tenant in TENANTS:
        async with LlmbusClient(secured_kafka.settings(f"tenant-{tenant}", prefix)) as client:
            request = InferenceRequest(prompt=f"hello from {tenant}", model="sim-llama-8b", max_tokens=8)
            chunks = [c async for c in client.stream(request, timeout_s=60)]
        final = chunks[-1]
        assert final.final and final.error is None, final
        assert final.tenant == tenant and final.usage is not None and final.usage.completion_tokens > 0


async def test_over_tls_a_tenant_is_served_and_a_broker_it_cannot_verify_is_refused(
    secured_kafka: SecuredKafka, prefix: str, stack: None, caplog: pytest.LogCaptureFixture
) -> None:
    """KAFKA_TLS=1: the same SCRAM users and ACLs on a SASL_SSL listener whose certificate the local
    CA signed. A client trusting that CA is served end to end; one that does not refuses to connect."""
    over_tls = secured_kafka.settings("tenant-acme", prefix, tls_ca_file=secured_kafka.ca_file)
    async with LlmbusClient(over_tls) as client:
        request = InferenceRequest(prompt="hello over TLS", model="sim-llama-8b", max_tokens=8)
        chunks = [c async for c in client.stream(request, timeout_s=60)]
    assert chunks[-1].final and chunks[-1].error is None and chunks[-1].tenant == "acme", chunks[-1]
    with pytest.raises(TopicAuthorizationFailedError):  # TLS changes the wire, not what a tenant may do
        await produce_as_with(over_tls, t.RESULTS, InferenceRequest(prompt="junk"), key="k")

    untrusting = over_tls.model_copy(update={"kafka_ssl_cafile": None})  # the system CAs only
    producer = make_producer(untrusting, client_id="test-untrusting")
    with pytest.raises(KafkaConnectionError):
        await asyncio.wait_for(producer.start(), 30)
    await stop_producer(producer, 10)
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text  # aiokafka logs the reason, raises a generic error


async def test_a_tenant_writes_its_own_feedback_topic_only(secured_kafka: SecuredKafka, prefix: str) -> None:
    mine = Feedback(request_id="r", tenant="acme", score=1.0)
    await produce_as(secured_kafka, "tenant-acme", prefix, "llm.feedback.acme", mine, key="r")
    for topic in ("llm.feedback.globex", t.FEEDBACK):  # another tenant's; the shared one is the gateway's
        with pytest.raises(TopicAuthorizationFailedError):
            await produce_as(
                secured_kafka, "tenant-acme", prefix, topic, mine.model_copy(update={"tenant": "globex"}), "r"
            )


@pytest.fixture(scope="module")
async def comparator(
    secured_kafka: SecuredKafka, prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ComparatorStore]:
    """The shadow-comparator as its own principal; its Redis store, to read what it counted."""
    settings = secured_kafka.settings(t.COMPARATOR, prefix)
    proc = ServiceProc(
        "llmbus_services.shadow_comparator",
        settings,
        secured_kafka.env(t.COMPARATOR) | {"LLMBUS_COMPARATOR_DECIDE": "false"},
        tmp_path_factory.mktemp("secured-comparator"),
    ).start()
    store = ComparatorStore(redis_client(settings.redis_url, password=settings.redis_password), f"{prefix}comparator")
    try:
        yield store
    except BaseException:
        print(f"\n--- log of {proc.name} ---\n{proc.log_tail()}")
        raise
    finally:
        proc.kill()
        await store.drop()
        await store.close()


async def test_feedback_counts_only_from_the_requests_own_tenant(
    secured_kafka: SecuredKafka, prefix: str, comparator: ComparatorStore
) -> None:
    """acme learned globex's request id: its feedback (first, on its own topic) is about acme's own
    request of that id (none: unjoined, not counted), one claiming to be globex's is dead-lettered,
    and globex's own feedback counts."""
    rid = uuid.uuid4().hex
    # The comparator serves the whole module's namespace (other tests' probes reach it too): count from here.
    before = await comparator.stats()
    result = InferenceResult(
        request_id=rid, tenant="globex", status=ResultStatus.OK, model="m", experiment_id="exp", variant="candidate"
    )
    await produce_as(secured_kafka, t.WORKER, prefix, t.RESULTS, result, key=rid)
    await eventually(lambda: comparator.request_variant(request_key("globex", rid), rid), timeout_s=60)
    foreign = Feedback(request_id=rid, tenant="acme", score=0.0)
    await produce_as(secured_kafka, "tenant-acme", prefix, "llm.feedback.acme", foreign, rid)
    claim = Feedback(request_id=rid, tenant="globex", score=0.0)
    await produce_as(secured_kafka, "tenant-acme", prefix, "llm.feedback.acme", claim, rid)
    async with LlmbusClient(secured_kafka.settings("tenant-globex", prefix)) as client:  # to llm.feedback.globex
        await client.send_feedback(Feedback(request_id=rid, score=1.0))

    kinds = ("feedback_joined", "feedback_unjoined", "feedback_refused")

    async def counted() -> tuple[int, ...]:
        stats = await comparator.stats()
        return tuple(stats.get(k, 0) - before.get(k, 0) for k in kinds)

    async def settled() -> bool:
        return all(n >= 1 for n in await counted())

    await eventually(settled, timeout_s=30)
    agg = await comparator.read_agg("exp", 0, "candidate")
    assert (agg.get("fb_n"), agg.get("fb_neg", 0.0)) == (1.0, 0.0), agg  # globex's score alone
    joined, unjoined, refused_n = await counted()
    # Unjoined: at least acme's own-request feedback. The module's earlier tests leave feedback of
    # their own on llm.feedback.acme that the comparator may count after `before` (it reads from the
    # earliest offset). acme's feedback being joined to globex's request would show above (fb_n 2).
    assert (joined, refused_n) == (1, 1) and unjoined >= 1
    letters = [DeadLetter.model_validate_json(v) for v in await read_as(secured_kafka, "operator", prefix, t.DLQ)]
    [refused] = [d for d in letters if d.request_id == rid]
    assert refused.error_code == ErrorCode.FORBIDDEN and refused.source_topic == f"{prefix}llm.feedback.acme"
    assert "feedback claims tenant 'globex'" in refused.error


async def test_the_retrain_reader_takes_each_feedbacks_tenant_from_its_topic(
    secured_kafka: SecuredKafka, prefix: str
) -> None:
    rid = uuid.uuid4().hex
    foreign = Feedback(request_id=rid, tenant="acme", score=0.0)
    await produce_as(secured_kafka, "tenant-acme", prefix, "llm.feedback.acme", foreign, rid)
    claim = Feedback(request_id=rid, tenant="globex", score=0.0)
    await produce_as(secured_kafka, "tenant-acme", prefix, "llm.feedback.acme", claim, rid)
    own = Feedback(request_id=rid, tenant="globex", score=1.0)
    await produce_as(secured_kafka, "tenant-globex", prefix, "llm.feedback.globex", own, rid)
    read = await read_feedback(secured_kafka.settings("operator", prefix), timeout_s=20)
    assert sorted((f.tenant, f.score) for f in read if f.request_id == rid) == [("acme", 0.0), ("globex", 1.0)]


# What each least-privilege reader needs, fixed here from issue 24 and services/archive/README.md
# (not derived from the catalog the ACLs come from): it may read these and nothing else.
ANALYTICS_READS = frozenset({t.RESULTS, t.COSTS, t.COMPARISONS, t.DECISIONS, t.SCALING, t.BUDGETS, t.WORKERS})
ARCHIVE_READS = frozenset(
    {t.RESULTS, t.COSTS, t.COMPARISONS, t.FEEDBACK, "llm.feedback.acme", t.REQUESTS, "llm.requests.acme"}
)


def every_topic() -> set[str]:
    """Every topic of a namespace: the catalog's, a tenant's own, a worker's dispatch topic."""
    return {spec.name for spec in t.CATALOG} | {name for name, _ in tenant_topics("acme")} | {"llm.dispatch.w1"}


async def commit_in_group(secured_kafka: SecuredKafka, user: str, prefix: str, topic: str, group: str) -> None:
    """Read one record of `topic` in consumer group `group` as `user` and commit it."""
    consumer = AIOKafkaConsumer(
        t.Topics(prefix).name(topic),
        group_id=f"{prefix}{group}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        bootstrap_servers=secured_kafka.bootstrap,
        **kafka_auth(secured_kafka.settings(user, prefix)),
    )
    try:
        await asyncio.wait_for(consumer.start(), 30)
        record = await asyncio.wait_for(consumer.getone(), 30)
        await asyncio.wait_for(consumer.commit(), 10)
        assert record.value is not None
    finally:
        await asyncio.wait_for(consumer.stop(), 10)


@pytest.mark.parametrize(
    ("user", "reads", "writes"),
    [(ANALYTICS, ANALYTICS_READS, frozenset()), (t.ARCHIVE, ARCHIVE_READS, frozenset({t.DLQ}))],
    ids=["analytics", "archive"],
)
async def test_a_reader_principal_reads_what_it_needs_and_nothing_else(
    secured_kafka: SecuredKafka, user: str, reads: frozenset[str], writes: frozenset[str]
) -> None:
    prefix = await fresh_namespace(secured_kafka)  # its own: the probes below meet no service
    topics = every_topic()
    assert reads | writes <= topics
    probes = {topic: f'{{"probe":"{uuid.uuid4().hex}"}}'.encode() for topic in reads}
    for topic, probe in probes.items():  # keyed: some of them are compacted
        await produce_as(secured_kafka, "admin", prefix, topic, probe, key="probe")
    for topic, probe in probes.items():
        assert probe in await read_as(secured_kafka, user, prefix, topic), topic
    refused_reads = []
    for topic in sorted(topics - reads):  # prompts, tokens, replies, control, dead letters, ...
        try:
            await read_as(secured_kafka, user, prefix, topic, seconds=10)
        except TopicAuthorizationFailedError:
            refused_reads.append(topic)
    assert refused_reads == sorted(topics - reads)

    # A job keeps its offsets in its own consumer groups (llmbus.<user>*), in no service's.
    topic = min(reads)
    await commit_in_group(secured_kafka, user, prefix, topic, f"llmbus.{user}.job-1")
    with pytest.raises(GroupAuthorizationFailedError):
        await commit_in_group(secured_kafka, user, prefix, topic, f"llmbus.{t.COST}")

    producer = AIOKafkaProducer(  # a plain producer (no idempotence): each topic answers for itself
        bootstrap_servers=secured_kafka.bootstrap, **kafka_auth(secured_kafka.settings(user, prefix))
    )
    refused_writes = []
    try:
        await asyncio.wait_for(producer.start(), 30)
        for topic in sorted(topics):
            send = producer.send_and_wait(t.Topics(prefix).name(topic), b"{}", key=b"k", partition=0)
            try:
                await asyncio.wait_for(send, 20)
            except TopicAuthorizationFailedError:
                refused_writes.append(topic)
    finally:
        await stop_producer(producer, 10)
    assert refused_writes == sorted(topics - writes)


async def test_analytics_cannot_even_start_the_projects_producer(secured_kafka: SecuredKafka, prefix: str) -> None:
    # The project's producer is idempotent: with no write right anywhere there is no IdempotentWrite.
    result = InferenceResult(request_id="r", tenant="acme", status=ResultStatus.OK)
    with pytest.raises(ClusterAuthorizationFailedError):
        await produce_as(secured_kafka, ANALYTICS, prefix, t.RESULTS, result, key="k")
