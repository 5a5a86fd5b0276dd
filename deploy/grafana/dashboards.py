"""Grafana dashboards as code: `python deploy/grafana/dashboards.py` writes dashboards/*.json.

Three layers: infrastructure (GPU, VRAM, ECC, KV use, broker lag), quality (errors,
fallbacks, retries, experiments, shadows, dead letters, cache) and user experience (TTFT,
total time, tokens/s, completion rate). Every expression uses series the services export
(tests/unit/test_dashboards.py checks them against the live registries and that the
committed JSON is what this file writes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "llmbus-prometheus"}

Panel = tuple[str, str, list[tuple[str, str]]]  # title, unit, [(expr, legend)]


def _q(quantile: float, metric: str, by: str = "", window: str = "5m") -> str:
    group = f"le{', ' + by if by else ''}"
    return f"histogram_quantile({quantile}, sum by ({group}) (rate({metric}_bucket[{window}])))"


INFRASTRUCTURE: list[Panel] = [
    (
        "GPU memory used",
        "percentunit",
        [("DCGM_FI_DEV_FB_USED / DCGM_FI_DEV_FB_TOTAL", "{{Hostname}} GPU {{gpu}}")],
    ),
    ("GPU temperature", "celsius", [("DCGM_FI_DEV_GPU_TEMP", "{{Hostname}} GPU {{gpu}}")]),
    ("GPU power", "watt", [("DCGM_FI_DEV_POWER_USAGE", "{{Hostname}} GPU {{gpu}}")]),
    (
        "ECC errors (volatile)",
        "short",
        [
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "double-bit {{Hostname}} GPU {{gpu}}"),
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "single-bit {{Hostname}} GPU {{gpu}}"),
        ],
    ),
    ("KV cache use", "percentunit", [("llmbus_worker_kv_cache_usage_perc", "{{worker_id}}")]),
    (
        "Engine requests",
        "short",
        [
            ("sum by (worker_id) (llmbus_worker_num_requests_running)", "running {{worker_id}}"),
            ("sum by (worker_id) (llmbus_worker_num_requests_waiting)", "waiting {{worker_id}}"),
        ],
    ),
    ("Workers ready", "short", [("sum by (model_name) (llmbus_worker_ready)", "{{model_name}}")]),
    ("Broker lag", "short", [("sum by (service, topic) (llmbus_consumer_lag_records)", "{{service}} {{topic}}")]),
    ("Handler time p99", "s", [(_q(0.99, "llmbus_handler_seconds", "service"), "{{service}}")]),
    ("Host memory free", "bytes", [('llmbus_node_memory_bytes{state="free"}', "{{Hostname}}")]),
]

QUALITY: list[Panel] = [
    (
        "Errors by code",
        "reqps",
        [('sum by (code) (rate(llmbus_request_results_total{status="error"}[5m]))', "{{code}}")],
    ),
    (
        "Fallbacks and retries",
        "reqps",
        [
            ('sum by (model) (rate(llmbus_routed_total{rule="fallback"}[5m]))', "fallback to {{model}}"),
            ('sum(rate(llmbus_dispatches_total{retry="true"}[5m]))', "retries"),
        ],
    ),
    ("Routes by rule", "reqps", [("sum by (rule, model) (rate(llmbus_routed_total[5m]))", "{{rule}} -> {{model}}")]),
    (
        "Experiments: traffic by variant",
        "reqps",
        [('sum by (variant, model) (rate(llmbus_routed_total{variant!=""}[5m]))', "{{variant}} ({{model}})")],
    ),
    (
        "Shadow copies",
        "reqps",
        [('sum by (model) (rate(llmbus_routed_total{shadow="true"}[5m]))', "{{model}}")],
    ),
    (
        "Experiments: error rate by model",
        "percentunit",
        [
            (
                'sum by (model) (rate(llmbus_request_results_total{status="error"}[15m]))'
                " / sum by (model) (rate(llmbus_request_results_total[15m]))",
                "{{model}}",
            )
        ],
    ),
    (
        "Dead letters",
        "short",
        [("sum by (service, code) (increase(llmbus_dead_letters_total[5m]))", "{{service}} {{code}}")],
    ),
    (
        "Exact cache hit ratio",
        "percentunit",
        [
            (
                'sum(rate(llmbus_router_cache_lookups_total{outcome="hit"}[5m]))'
                " / sum(rate(llmbus_router_cache_lookups_total[5m]))",
                "hits",
            )
        ],
    ),
    ("Preemptions", "short", [("sum by (model) (increase(llmbus_request_preemptions_total[5m]))", "{{model}}")]),
    (
        "Releases: results by version and stage",
        "reqps",
        [
            (
                "sum by (model, version, upgrade_id, stage) (rate(llmbus_version_results_total[5m]))",
                "{{model}}@{{version}} {{upgrade_id}} {{stage}}",
            )
        ],
    ),
    (
        "Releases: error rate by version",
        "percentunit",
        [
            (
                'sum by (model, version) (rate(llmbus_version_results_total{status="error"}[15m]))'
                " / sum by (model, version) (rate(llmbus_version_results_total[15m]))",
                "{{model}}@{{version}}",
            )
        ],
    ),
]

USER_EXPERIENCE: list[Panel] = [
    (
        "Time to first token",
        "s",
        [
            (_q(0.5, "llmbus_request_time_to_first_token_seconds", "model"), "p50 {{model}}"),
            (_q(0.95, "llmbus_request_time_to_first_token_seconds", "model"), "p95 {{model}}"),
        ],
    ),
    (
        "Total time",
        "s",
        [
            (_q(0.5, "llmbus_request_e2e_request_latency_seconds", "model"), "p50 {{model}}"),
            (_q(0.95, "llmbus_request_e2e_request_latency_seconds", "model"), "p95 {{model}}"),
        ],
    ),
    (
        "Total time by model version",
        "s",
        [
            (_q(0.5, "llmbus_version_e2e_request_latency_seconds", "model, version"), "p50 {{model}}@{{version}}"),
            (_q(0.95, "llmbus_version_e2e_request_latency_seconds", "model, version"), "p95 {{model}}@{{version}}"),
        ],
    ),
    (
        "Output tokens per second",
        "short",
        [
            ("sum by (model) (rate(llmbus_request_generation_tokens_total[1m]))", "{{model}}"),
            ("sum(llmbus_worker_generation_tokens_per_second)", "engines (heartbeats)"),
        ],
    ),
    (
        "Completion rate",
        "percentunit",
        [
            (
                'sum(rate(llmbus_request_results_total{status="ok",shadow="false"}[5m]))'
                ' / sum(rate(llmbus_request_results_total{shadow="false"}[5m]))',
                "completed",
            )
        ],
    ),
    (
        "Queue wait per pool",
        "s",
        [(_q(0.5, "llmbus_scheduler_queue_wait_seconds", "model_name"), "p50 {{model_name}}")],
    ),
    (
        "TTFT per pool (the autoscaler's latency trigger)",
        "s",
        [(_q(0.99, "llmbus_scheduler_time_to_first_token_seconds", "model_name"), "p99 {{model_name}}")],
    ),
    (
        "Prefill backlog per pool (prompt tokens waiting in the engines)",
        "short",
        [("llmbus_scheduler_prefill_backlog_tokens", "{{model_name}}")],
    ),
    (
        "Gateway: time to first byte of the answer",
        "s",
        [(_q(0.95, "llmbus_gateway_time_to_first_token_seconds", "endpoint"), "p95 {{endpoint}}")],
    ),
    (
        "Gateway: requests by status",
        "reqps",
        [("sum by (status) (rate(llmbus_gateway_requests_total[5m]))", "{{status}}")],
    ),
    (
        "Gateway: in flight and hang-ups",
        "short",
        [
            ("sum(llmbus_gateway_requests_in_flight)", "in flight"),
            ("sum(increase(llmbus_gateway_client_disconnects_total[5m]))", "client hang-ups"),
        ],
    ),
]

DASHBOARDS = {
    "infrastructure": ("llmbus: infrastructure", INFRASTRUCTURE),
    "quality": ("llmbus: quality", QUALITY),
    "user-experience": ("llmbus: user experience", USER_EXPERIENCE),
}


def dashboard(uid: str, title: str, panels: list[Panel]) -> dict[str, object]:
    out = []
    for i, (panel_title, unit, targets) in enumerate(panels):
        out.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": panel_title,
                "datasource": DATASOURCE,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {"refId": chr(ord("A") + j), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
                    for j, (expr, legend) in enumerate(targets)
                ],
            }
        )
    return {
        "uid": f"llmbus-{uid}",
        "title": title,
        "tags": ["llmbus"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "panels": out,
    }


def render() -> dict[str, str]:
    return {
        f"{name}.json": json.dumps(dashboard(name, title, panels), indent=2) + "\n"
        for name, (title, panels) in DASHBOARDS.items()
    }


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for filename, text in render().items():
        (OUT / filename).write_text(text)
    sys.stdout.write(f"wrote {len(DASHBOARDS)} dashboards to {OUT.name}/\n")
