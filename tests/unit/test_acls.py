"""ACLs generated from the catalog: tenants reach only their own topics, services only theirs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmbus.contract import topics as t
from llmbus.security import acls as a


def test_a_tenant_writes_only_its_requests_and_feedback_and_reads_only_its_replies() -> None:
    mine = a.tenant_acls("p.", "acme")
    writes = {(x.pattern, x.name) for x in mine if x.operation == "write"}
    reads = {(x.pattern, x.name) for x in mine if x.operation == "read" and x.resource_type == "topic"}
    assert writes == {("literal", "p.llm.requests.acme"), ("literal", "p.llm.feedback.acme")}
    assert reads == {("literal", "p.llm.replies.acme"), ("prefixed", "p.llm.replies.acme.")}
    assert {x.principal for x in mine} == {"tenant-acme"}


@pytest.mark.parametrize("bad", ["a.b", "gw-x", "", "x" * 65])
def test_tenant_names_that_could_overlap_another_namespace_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        a.tenant_acls("", bad)


def test_only_operators_and_the_catalogs_services_write_control_models_experiments() -> None:
    acls = a.all_acls("", ["acme", "globex"])
    for topic in (t.CONTROL, t.MODELS, t.EXPERIMENTS):
        writers = {x.principal for x in acls if x.operation == "write" and x.name == topic}
        spec = t.BY_NAME[topic]
        assert a.OPERATOR in writers
        assert writers - {a.OPERATOR} == set(spec.writers) - set(a.OPERATOR_ROLES)
        assert not any(w.startswith(a.TENANT_PRINCIPAL_PREFIX) for w in writers)


def test_only_the_gateway_writes_the_shared_request_topic_and_only_workers_write_heartbeats() -> None:
    acls = a.service_acls("")
    assert {x.principal for x in acls if x.operation == "write" and x.name == t.REQUESTS} == {t.GATEWAY}
    assert {x.principal for x in acls if x.operation == "write" and x.name == t.WORKERS} == {t.WORKER}


def test_every_catalog_topic_has_a_writer_and_a_reader() -> None:
    acls = a.service_acls("")
    unread = set()
    for spec in t.CATALOG:
        assert any(x.operation == "write" and x.name == spec.name for x in acls), spec.name
        if not any(x.operation == "read" and x.name == spec.name for x in acls):
            unread.add(spec.name)
    # The shadow copies' chunks too: the comparator compares results, but a worker reads a cut shadow
    # answer back to continue it, as any other.
    assert unread == set()
    reply_readers = {x.principal for x in acls if x.operation == "read" and x.name.startswith(t.REPLIES_PREFIX)}
    assert t.WORKER in reply_readers


def test_only_the_gateway_writes_the_shared_feedback_topic_and_the_comparator_reads_every_tenants() -> None:
    acls = a.all_acls("p.", ["acme", "globex"])
    assert {x.principal for x in acls if x.operation == "write" and x.name == "p.llm.feedback"} == {t.GATEWAY}
    assert {x.principal for x in acls if x.operation == "write" and x.name == "p.llm.feedback.globex"} == {
        "tenant-globex"
    }
    assert a.Acl(t.COMPARATOR, "topic", "prefixed", "p.llm.feedback.", "read") in acls
    assert not any(
        x.principal.startswith(a.TENANT_PRINCIPAL_PREFIX) and x.pattern == "prefixed" and x.operation == "write"
        for x in acls
    )


def test_a_tenants_topics_include_its_feedback_topic() -> None:
    assert [name for name, _ in a.tenant_topics("acme")] == [
        "llm.requests.acme",
        "llm.replies.acme",
        "llm.feedback.acme",
    ]
    assert t.Topics("p.").spec_of("p.llm.feedback.acme") is t.FEEDBACK_TENANT_SPEC


ANALYTICS_TOPICS = {t.RESULTS, t.COSTS, t.COMPARISONS, t.DECISIONS, t.SCALING, t.BUDGETS, t.WORKERS}


def test_analytics_reads_what_it_needs_and_nothing_else() -> None:
    mine = [x for x in a.all_acls("p.", ["acme"]) if x.principal == a.ANALYTICS]
    reads = {x.name.removeprefix("p.") for x in mine if x.operation == "read" and x.resource_type == "topic"}
    assert reads == ANALYTICS_TOPICS
    assert all(x.pattern == "literal" for x in mine if x.resource_type == "topic")  # no prefix reaching prompts
    assert {(x.resource_type, x.pattern, x.name, x.operation) for x in mine if x.resource_type == "group"} == {
        ("group", "prefixed", "p.llmbus.analytics", "read")
    }
    assert not [x for x in mine if x.operation in ("write", "create")]
    assert a.ANALYTICS in a.principals([]) and a.ANALYTICS != a.OPERATOR


def test_nobody_but_operators_and_the_router_reads_prompts() -> None:
    acls = a.all_acls("p.", ["acme"])
    prompt_topics = {"p." + t.REQUESTS, "p." + t.ROUTED, "p." + t.DLQ}
    readers = {x.principal for x in acls if x.operation == "read" and x.name in prompt_topics}
    assert a.ANALYTICS not in readers and a.OPERATOR in readers


def test_kafka_sh_creates_every_principal_but_tenants_and_admin() -> None:
    script = (Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "kafka.sh").read_text()
    users = re.search(r'^SERVICE_USERS="([^"]*)"', script, re.M)
    assert users is not None
    assert set(users.group(1).split()) == set(a.principals([])) - {"admin"}


def test_archive_reads_what_it_archives_and_writes_only_the_dlq() -> None:
    acls = [acl for acl in a.service_acls("p.") if acl.principal == t.ARCHIVE]
    reads = {acl.name for acl in acls if acl.operation == "read" and acl.resource_type == "topic"}
    assert reads == {
        "p.llm.results",
        "p.llm.costs",
        "p.llm.comparisons",
        "p.llm.feedback",
        "p.llm.feedback.",
        "p.llm.requests",
        "p.llm.requests.",
    }
    assert {acl.name for acl in acls if acl.operation == "write"} == {"p.llm.dlq"}
    assert a.Acl(t.ARCHIVE, "group", "prefixed", "p.llmbus.archive", "read") in acls
