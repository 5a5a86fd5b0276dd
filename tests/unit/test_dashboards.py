"""The Grafana dashboards: current with their code, in Grafana's provisioning format, and asking
only for series the services really export (read from the processes' own metric registries)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY, CollectorRegistry

from llmbus.contract.messages import GpuInfo, NodeProfile

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("grafana_dashboards", GRAFANA / "dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exported_series() -> set[str]:
    """Every series name the services' processes register (importing them registers their metrics)."""
    import llmbus_services.engine_worker.adapters.metrics
    import llmbus_services.gateway.adapters.metrics
    import llmbus_services.router.adapters.cache
    import llmbus_services.router.adapters.limits
    import llmbus_services.scheduler.adapters.pool_stats  # noqa: F401
    from llmbus.node.gauges import register_node_metrics

    node = CollectorRegistry()
    gpu = GpuInfo(
        index=0,
        name="g",
        uuid="u",
        memory_total_bytes=1,
        memory_free_bytes=1,
        compute_capability="9.0",
        ecc_corrected_volatile=0,
        ecc_uncorrected_volatile=0,
        ecc_corrected_aggregate=0,
        ecc_uncorrected_aggregate=0,
        temperature_c=40,
        power_w=100.0,
    )
    profile = NodeProfile(node_id="n", hostname="h", kind="gpu", gpus=[gpu])
    register_node_metrics(node, lambda: profile)
    names: set[str] = set()
    for registry in (REGISTRY, node):
        for family in registry.collect():
            suffixes = {
                "counter": ("_total",),
                "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("_sum", "_count"),
            }.get(family.type, ("",))
            names |= {family.name + suffix for suffix in suffixes}
    return names


def test_dashboards_are_what_their_code_writes() -> None:
    for filename, text in _generator().render().items():
        assert (GRAFANA / "dashboards" / filename).read_text() == text, "run python deploy/grafana/dashboards.py"


def test_dashboards_load_in_grafana_provisioning_format() -> None:
    datasources = yaml.safe_load((GRAFANA / "provisioning/datasources/datasources.yaml").read_text())
    uids = {d["uid"] for d in datasources["datasources"]}
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/dashboards.yaml").read_text())
    assert providers["apiVersion"] == 1 and providers["providers"][0]["type"] == "file"
    seen_uids = set()
    for path in sorted((GRAFANA / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        assert board["uid"] not in seen_uids and board["title"] and board["schemaVersion"] >= 36
        seen_uids.add(board["uid"])
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] in uids and {"h", "w", "x", "y"} <= set(panel["gridPos"])
            assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"])
    assert {"llmbus-infrastructure", "llmbus-quality", "llmbus-user-experience"} == seen_uids


def test_every_queried_series_is_exported_by_some_service() -> None:
    exported = exported_series()
    asked = set()
    for path in (GRAFANA / "dashboards").glob("*.json"):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                asked |= set(re.findall(r"\b((?:llmbus_|DCGM_)[A-Za-z0-9_]+)", target["expr"]))
    assert len(asked) > 20
    missing = sorted(asked - exported)
    assert not missing, f"dashboards ask for series nobody exports: {missing}"
