"""inference-perf (kubernetes-sigs) as the peer benchmark's external load generator.

One run per (target, concurrency): its `concurrent` load type with `num_requests` and
`concurrency_level`, streaming chat completions. Its only prompt generator that sends chat requests
without images is `mock` ("mock prompt <i>": every prompt distinct, so no answer cache can serve one),
which asks for its client's default of 30 tokens; the upstream answers every path with the run's
answer length (bench.peer_upstream --answer-tokens), so the answers are as long as the project
driver's. It counts tokens with a tokenizer; none can be downloaded here, so it is given the tiny
model's (llmbus_tools.harness.tiny_llama), built locally. Its own report
(`stage_0_lifecycle_metrics.json`) gives requests/s, time to first token, request latency and failures.

A limit of its `concurrent` mode, read in its source (inference_perf/main.py): a stage's requests
are enqueued over one second, so a stage can never show more than `num_requests` requests/s. A
row within 10 % of that ceiling is marked `capped`.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml

from bench.peer_targets import Target
from bench.peer_venvs import PeerVenv

WORKERS = 2  # its load-generating processes: one per core of the machine


def config(target: Target, concurrency: int, requests: int, tokenizer_dir: Path, out_dir: Path) -> dict[str, object]:
    server: dict[str, object] = {"type": "vllm", "model_name": target.model, "base_url": target.root_url}
    authorization = target.headers.get("authorization", "")
    if authorization.startswith("Bearer "):
        server["api_key"] = authorization.removeprefix("Bearer ")
    return {
        "api": {"type": "chat", "streaming": True},
        "data": {"type": "mock"},
        "load": {
            "type": "concurrent",
            "stages": [{"num_requests": requests, "concurrency_level": concurrency}],
            "num_workers": WORKERS,
            "request_timeout": 120,
        },
        "server": server,
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer_dir)},
        "storage": {"local_storage": {"path": str(out_dir)}},
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def summarise(stage: dict[str, object], requests: int) -> dict[str, object]:
    """The figures the peer report shows, from inference-perf's stage report."""
    successes: dict = stage.get("successes") or {}  # type: ignore[assignment]
    failures: dict = stage.get("failures") or {}  # type: ignore[assignment]
    latency = successes.get("latency") or {}
    first = latency.get("time_to_first_token") or {}
    final = latency.get("request_latency") or {}
    rate = (successes.get("throughput") or {}).get("requests_per_sec")
    return {
        "requests": (successes.get("count") or 0) + (failures.get("count") or 0),
        "requests_per_s": rate,
        "first_token_ms": {"p50": _ms(first.get("median")), "p99": _ms(first.get("p99"))},
        "final_ms": {"p50": _ms(final.get("median")), "p99": _ms(final.get("p99"))},
        "errors": failures.get("count") or 0,
        "error_kinds": failures.get("by_label") or {},
        # Its concurrent mode enqueues a stage over one second: it cannot show more than N requests/s.
        "capped": rate is not None and rate >= 0.9 * requests,
    }


def run(
    venv: PeerVenv,
    target: Target,
    concurrency: int,
    requests: int,
    tokenizer_dir: Path,
    work: Path,
) -> dict[str, object]:
    """One inference-perf run; its summary, plus the wall time and the log's path."""
    out_dir = work / f"inference-perf-{len(list(work.glob('inference-perf-*')))}"
    out_dir.mkdir(parents=True)
    config_path = out_dir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config(target, concurrency, requests, tokenizer_dir, out_dir)))
    log = out_dir / "inference-perf.log"
    started = time.monotonic()
    with log.open("wb") as out:
        done = subprocess.run(
            [str(venv.bin("inference-perf")), "--config_file", str(config_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=120 + requests * 2,
        )
    report = out_dir / "stage_0_lifecycle_metrics.json"
    if done.returncode != 0 or not report.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        return {"error": f"inference-perf exited with {done.returncode}", "log_tail": tail}
    summary = summarise(json.loads(report.read_text()), requests)
    return summary | {"wall_s": round(time.monotonic() - started, 1)}
