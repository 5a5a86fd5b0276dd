"""The three dashboard layers (deploy/prometheus/consoles/, Prometheus console templates served by
the stack's Prometheus at /consoles/): each layer's console exists and is mounted and served, and
every llmbus series a console queries is one some service exports (read from the registry after
importing every module that declares metrics), with the suffix its type gives it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

REPO = Path(__file__).resolve().parents[2]
CONSOLES = REPO / "deploy/prometheus/consoles"
LAYERS = {
    "llmbus-infrastructure.html": {"up", "llmbus_consumer_lag_records", "llmbus_scheduler_queue_wait_seconds_bucket"},
    "llmbus-quality.html": {
        "llmbus_feedback_score_sum",
        "llmbus_comparisons_total",
        "llmbus_comparison_similarity_sum",
        "llmbus_request_results_total",
    },
    "llmbus-experience.html": {
        "llmbus_request_time_to_first_token_seconds_bucket",
        "llmbus_request_e2e_request_latency_seconds_bucket",
        "llmbus_session_turns_total",
    },
}
_GO_STRING = re.compile(r'(?:query|printf) "((?:[^"\\]|\\.)*)"')
_SERIES = re.compile(r"\b(llmbus_[a-z0-9_]+|up(?=\{))")


def queries(console: Path) -> list[str]:
    """The PromQL of a console: the Go string literals given to `query` or formatted for it."""
    return [m.group(1).replace('\\"', '"') for m in _GO_STRING.finditer(console.read_text())]


def exported() -> set[str]:
    """Every sample name the code's metrics export (counters with _total, histograms' _bucket/_sum/_count)."""
    # Each folder under its import name: services/ is the package llmbus_services (setup.py).
    for folder, package in ((REPO / "libs/common/llmbus", "llmbus"), (REPO / "services", "llmbus_services")):
        for path in folder.glob("**/*.py"):
            text = path.read_text()
            if "prometheus_client" in text and ("Counter(" in text or "Gauge(" in text or "Histogram(" in text):
                importlib.import_module(".".join((package, *path.relative_to(folder).with_suffix("").parts)))
    names = set()
    for metric in REGISTRY.collect():
        names |= {metric.name, f"{metric.name}_total", f"{metric.name}_bucket", f"{metric.name}_sum"}
        names.add(f"{metric.name}_count")
    return names


def test_one_console_per_layer_and_each_queries_its_layers_series() -> None:
    for name, wanted in LAYERS.items():
        used = {s for q in queries(CONSOLES / name) for s in _SERIES.findall(q)}
        assert wanted <= used, f"{name} lacks {wanted - used}"


@pytest.mark.parametrize("name", [*LAYERS, "index.html"])
def test_every_series_a_console_queries_is_exported_by_a_service(name: str) -> None:
    names = exported()
    found = [q for q in queries(CONSOLES / name) if "llmbus_" in q or "up{" in q]
    assert found or name == "index.html"
    for query in found:
        for series in _SERIES.findall(query):
            assert series == "up" or series in names, f"{name}: {series} is exported by no service ({query})"
        filled = query.replace("%q", '"x"')
        for open_, close in ("()", "{}", "[]"):
            assert filled.count(open_) == filled.count(close), f"{name}: unbalanced {open_}{close} in {query}"


def test_every_template_a_console_uses_is_defined_in_the_library() -> None:
    library = (REPO / "deploy/prometheus/console_libraries/llmbus.lib").read_text()
    defined = set(re.findall(r'{{ define "([^"]+)" }}', library))
    for console in CONSOLES.glob("*.html"):
        used = set(re.findall(r'{{ template "([^"]+)"', console.read_text()))
        assert used and used <= defined, f"{console.name}: {used - defined} not in llmbus.lib"


def test_the_stacks_prometheus_serves_the_consoles() -> None:
    compose = yaml.safe_load((REPO / "deploy/compose/docker-compose.yml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "../prometheus/consoles:/etc/prometheus/consoles:ro" in mounts
    assert "../prometheus/console_libraries:/etc/prometheus/console_libraries:ro" in mounts
    run = (REPO / "deploy/prometheus/run.sh").read_text()
    assert "--web.console.templates=/etc/prometheus/consoles" in run
    assert "--web.console.libraries=/etc/prometheus/console_libraries" in run
