"""docs/topics.md shows the catalog as it is, and per-topic retention overrides reach the topic config."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmbus.bus.admin import topic_config
from llmbus.contract import topics as t
from llmbus.settings import BusSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "topics.md"


def test_the_doc_shows_the_catalogs_keys_partitions_and_retention() -> None:
    text = DOC.read_text()
    generated = text.split("-->\n", 1)[1].split("<!-- catalog:end -->", 1)[0]
    assert generated == t.catalog_table(), "docs/topics.md is stale: paste llmbus.contract.topics.catalog_table() in"


def test_analytics_topics_spread_and_costs_are_keyed_by_record_id() -> None:
    for name in (t.COMPARISONS, t.DECISIONS, t.SCALING, t.COSTS):
        assert t.BY_NAME[name].partitions > 1, name
    assert t.BY_NAME[t.COSTS].key == "record id"


def test_retention_is_overridden_per_topic_and_unknown_names_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMBUS_TOPIC_RETENTION_MS", '{"llm.results": 2592000000, "llm.dispatch.<worker_id>": 3600000}')
    settings = BusSettings()
    assert topic_config(settings, t.BY_NAME[t.RESULTS])["retention.ms"] == "2592000000"
    assert topic_config(settings, t.DISPATCH_SPEC)["retention.ms"] == "3600000"
    assert topic_config(settings, t.BY_NAME[t.COSTS])["retention.ms"] == str(7 * t.DAY_MS)  # the default
    with pytest.raises(ValueError, match=r"llm\.resluts"):
        topic_config(BusSettings(topic_retention_ms={"llm.resluts": 1}), t.BY_NAME[t.RESULTS])
