"""`llmbus gc`'s decisions, pure: which instances are gone, which topics are an instance's."""

from __future__ import annotations

import pytest

from llmbus.cli.gc import instance_topics, parse_duration_ms, plan_gc
from llmbus.contract import topics as t

HOUR_MS = 3_600_000
NOW_MS = 1_000 * HOUR_MS


def test_durations() -> None:
    assert [parse_duration_ms(d) for d in ("90s", "30m", "12h", "7d", "1.5h")] == [
        90_000,
        30 * 60_000,
        12 * HOUR_MS,
        7 * 24 * HOUR_MS,
        int(1.5 * HOUR_MS),
    ]
    for bad in ("7", "d", "-1d", "7w", ""):
        with pytest.raises(ValueError, match="expected a number and a unit"):
            parse_duration_ms(bad)


def test_gone_is_silent_longer_than_the_retention_by_its_newest_sign() -> None:
    topics = t.Topics("ns.")
    plan = plan_gc(
        topics,
        NOW_MS,
        older_than_ms=2 * HOUR_MS,
        heartbeats_ms={"w-live": NOW_MS, "w-old": NOW_MS - 3 * HOUR_MS, "w-beat-old-topic-new": NOW_MS - 5 * HOUR_MS},
        dispatch_last_ms={"w-live": None, "w-old": None, "w-beat-old-topic-new": NOW_MS - HOUR_MS, "w-empty": None},
        replies_last_ms={"gw-live": NOW_MS - HOUR_MS, "gw-old": NOW_MS - 3 * HOUR_MS, "gw-idle": None},
    )
    gone = {(g.kind, g.instance): g for g in plan.gone}
    assert set(gone) == {("worker", "w-old"), ("gateway", "gw-old")}
    worker = gone[("worker", "w-old")]
    assert worker.topic == "ns.llm.dispatch.w-old" and worker.tombstone
    assert worker.groups == ("ns.llmbus.engine-worker.w-old", "ns.llmbus.engine-worker.w-old.control")
    assert gone[("gateway", "gw-old")].topic == "ns.llm.replies.gw-old" and not gone[("gateway", "gw-old")].groups
    # no heartbeat and an empty topic: age unknown, kept
    assert plan.kept_unknown == ["ns.llm.dispatch.w-empty", "ns.llm.replies.gw-idle"]


def test_a_heartbeat_without_a_topic_is_still_tombstoned() -> None:
    plan = plan_gc(t.Topics(""), NOW_MS, HOUR_MS, {"w": NOW_MS - 2 * HOUR_MS}, {}, {})
    (gone,) = plan.gone
    assert (gone.instance, gone.topic, gone.tombstone) == ("w", None, True)


def test_only_this_namespaces_instance_topics_and_never_a_tenants_replies() -> None:
    names = [
        "ns.llm.dispatch.w-1",
        "ns.llm.replies.gw-gateway-0",
        "ns.llm.replies.acme",  # a tenant's reply topics are not an instance's
        "ns.llm.replies.acme.batch",
        "other.llm.dispatch.w-2",  # another namespace
        "ns.llm.workers",
        "ns.llm.dispatch.",
    ]
    workers, gateways = instance_topics(t.Topics("ns."), names)
    assert workers == {"w-1": "ns.llm.dispatch.w-1"}
    assert gateways == {"gw-gateway-0": "ns.llm.replies.gw-gateway-0"}
