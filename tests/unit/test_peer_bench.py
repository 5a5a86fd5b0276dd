"""The peer benchmark's parts that need no broker: the upstream and the driver over real sockets, the
driver's reading of what gateways send, the comparisons and targets, inference-perf's config and
report, the profile helpers, the peers' configs and the CPU window."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import yaml

from bench import peer_hops, peer_profile, peer_upstream, peer_venvs
from bench.peer_inference_perf import config as inference_perf_config
from bench.peer_inference_perf import summarise as summarise_inference_perf
from bench.peer_load import Sample, closed_loop
from bench.peer_report import compare, markdown, summarise_point, verdicts
from bench.peer_targets import Target, litellm_config, tensorzero_config
from bench.pipeline_load import CpuWindow
from llmbus.observability.profiling import cpu_profiled


@pytest.fixture
async def upstream_url() -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(peer_upstream.UpstreamProtocol, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        server.close()


async def test_the_driver_gets_every_answer_of_the_upstream_whole(upstream_url: str) -> None:
    samples, elapsed_s = await closed_loop(upstream_url, "det", {}, concurrency=4, requests=40, tokens=16, tag="t")
    assert len(samples) == 40 and elapsed_s > 0
    assert all(s.error is None and s.tokens == 16 for s in samples)
    assert all(s.first_token_ms is not None and s.final_ms is not None for s in samples)
    assert all(s.first_token_ms <= s.final_ms for s in samples)  # type: ignore[operator]


async def test_the_driver_counts_a_short_answer_and_a_wrong_status_as_errors(
    upstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peer_upstream, "MAX_TOKENS", [10])  # --answer-tokens 10
    short, _ = await closed_loop(upstream_url, "det", {}, concurrency=2, requests=4, tokens=16, tag="t")
    assert [s.error for s in short] == ["10 of 16 tokens"] * 4
    missing, _ = await closed_loop(
        upstream_url.removesuffix("/v1") + "/nope", "det", {}, concurrency=1, requests=2, tokens=16, tag="t"
    )
    assert [s.error for s in missing] == ["HTTP 404"] * 2


def test_the_upstream_answers_at_most_its_answer_length_in_openai_s_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer_upstream, "MAX_TOKENS", [16])
    body = {"model": "det", "max_tokens": 30, "stream": True, "stream_options": {"include_usage": True}}
    events = peer_upstream.answer_events(body, chat=True, request_id="r").decode().split("\n\n")
    data = [json.loads(e.removeprefix("data: ")) for e in events if e.startswith("data: {")]
    texts = [c["delta"].get("content") for d in data for c in d["choices"] if c["delta"].get("content")]
    assert texts == [f" w{i}" for i in range(16)]
    assert data[-2]["choices"][0]["finish_reason"] == "length" and data[-1]["usage"]["completion_tokens"] == 16
    assert events[-2] == "data: [DONE]"
    whole = json.loads(peer_upstream.answer_json({"model": "det", "prompt": "a b"}, chat=False, request_id="r"))
    assert whole["choices"][0]["text"] == "".join(f" w{i}" for i in range(16))  # the default length


async def _serve_once(chunks: list[bytes]) -> tuple[asyncio.Server, str]:
    """A server that answers every request with a chunked SSE body made of `chunks` (one write each)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")).split(b":")[1]
        )
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for chunk in [*chunks, b""]:
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


async def test_the_driver_reads_chunked_streams_with_several_tokens_per_event_and_error_events() -> None:
    tokens = b'data: {"choices":[{"delta":{"content":" w0 w1"}}]}\n\n'  # a gateway's batched chunk
    split = [tokens[:20], tokens[20:], b': keep-alive\n\ndata: {"choices":[{"delta":{"content":" w2"}}]}\n\n']
    server, url = await _serve_once([*split, b"data: [DONE]\n\n"])
    try:
        [ok], _ = await closed_loop(url, "m", {}, concurrency=1, requests=1, tokens=3, tag="t")
    finally:
        server.close()
    assert ok.error is None and ok.tokens == 3
    server, url = await _serve_once([tokens, b'data: {"error": {"message": "boom"}}\n\n'])
    try:
        [failed], _ = await closed_loop(url, "m", {}, concurrency=1, requests=1, tokens=2, tag="t")
    finally:
        server.close()
    assert failed.error is not None and failed.error.startswith("error event")


def _row(
    target: str, c: int, rate: float, first_p50: float, final_p99: float, errors: int = 0, cpu: float = 1.0
) -> dict:
    return {
        "target": target,
        "driver": "own",
        "concurrency": c,
        "requests_per_s": rate,
        "first_token_ms": {"p50": first_p50, "p99": first_p50 * 2},
        "final_ms": {"p50": first_p50, "p99": final_p99},
        "errors": errors,
        "cpu_ms_per_request": {"gateway": cpu, "upstream": 0.1, "driver": 0.3},
        "control_plane_cpu_ms_per_request": cpu,
        "machine_busy_cores": 1.0,
        "others_busy_cores": 0.1,
        "loadavg_1min": [1.0, 1.0],
    }


ROWS = [
    _row("upstream direct", 1, 1000.0, 0.3, 1.0),
    _row("TensorZero", 1, 700.0, 0.8, 2.0),
    _row("llmbus", 1, 50.0, 1.8, 30.0),
    _row("upstream direct", 64, 2000.0, 10.0, 40.0),
    _row("TensorZero", 64, 900.0, 30.0, 80.0),
    _row("LiteLLM (2 workers)", 64, 30.0, 900.0, 4000.0),
    _row("llmbus", 64, 500.0, 50.0, 300.0, cpu=3.0),
    _row("llmbus baseline (main)", 64, 120.0, 90.0, 900.0, cpu=12.0),
]


def test_comparisons_are_ratios_within_the_run() -> None:
    by = {(c["target"], c["concurrency"]): c for c in compare(ROWS)}
    assert by[("llmbus", 1)]["first_token_added_ms"] == 1.5  # 1.8 - 0.3
    assert by[("TensorZero", 1)]["first_token_added_ms"] == 0.5
    assert by[("llmbus", 1)]["first_token_added_vs_tensorzero"] == 3.0
    assert by[("llmbus", 64)]["requests_per_s_vs_tensorzero"] == 0.56
    assert by[("llmbus", 64)]["requests_per_s_vs_upstream"] == 0.25


def test_the_issue_s_targets_are_judged_against_their_bounds() -> None:
    judged = {v["target"]: v for v in verdicts(ROWS, compare(ROWS), "llmbus", "llmbus baseline (main)")}
    met = {name.split(":")[0] + ":" + name.split(":")[-1][:12]: v["met"] for name, v in judged.items()}
    assert list(met.values()) == [True, True, False, True, True, True]  # c=64 is 0.25 of the upstream < 0.35
    cpu = next(v for name, v in judged.items() if "baseline" in name)
    assert cpu["value"] == 0.25  # 3.0 / 12.0 ms
    failing = [*ROWS[:-2], _row("llmbus", 64, 500.0, 50.0, 300.0, errors=3)]
    errors = next(v for v in verdicts(failing, compare(failing), "llmbus", None) if v["target"].startswith("no errors"))
    assert errors["met"] is False


def test_a_point_s_row_has_percentiles_errors_and_cpu_per_request() -> None:
    samples = [Sample(1.0 + i, 2.0 + i, 16, None) for i in range(98)] + [Sample(None, 5.0, 3, "3 of 16 tokens")] * 2
    window = {
        "elapsed_s": 2.0,
        "cpu_s": {"gateway": 0.5, "broker": 0.3, "upstream": 0.1, "driver": 0.2},
        "machine_busy_s": 2.0,
        "loadavg": [(1.5, 1.0, 1.0), (1.7, 1.0, 1.0)],
    }
    row = summarise_point("llmbus", 16, samples, 1.0, window)
    assert row["requests_per_s"] == 100.0 and row["errors"] == 2 and row["error_kinds"] == {"3 of 16 tokens": 2}
    assert row["first_token_ms"] == {"p50": 49.0, "p99": 98.0}  # nearest rank over the 98 good ones (1..98)
    assert row["cpu_ms_per_request"]["gateway"] == 5.0  # 0.5 s / 100 requests
    assert row["control_plane_cpu_ms_per_request"] == 8.0  # gateway + broker; not upstream or driver
    assert row["others_busy_cores"] == 0.45  # (2.0 - 1.1) s over 2 s
    report = {
        "command": "c",
        "started": "s",
        "finished": "f",
        "machine": "m",
        "loadavg_start": [1, 1, 1],
        "loadavg_end": [1, 1, 1],
        "tokens": 16,
        "requests": 100,
        "rows": ROWS,
        "comparisons": compare(ROWS),
        "verdicts": verdicts(ROWS, compare(ROWS), "llmbus", None),
        "notes": [],
        "versions": {"tensorzero": "x"},
    }
    page = markdown(report)
    assert "| llmbus | 64 | 500 |" in page and "(+1.50)" in page
    assert page.endswith("![peer](peer.png)\n")
    assert markdown(report, "peer_other.png").endswith("![peer](peer_other.png)\n")  # `--out` elsewhere: its own plot


def test_inference_perf_is_configured_for_the_target_and_its_report_is_read() -> None:
    target = Target(
        "TensorZero", "http://127.0.0.1:9/openai/v1", "tensorzero::model_name::det", {}, {"authorization": "Bearer k"}
    )
    cfg = inference_perf_config(target, 16, 1000, Path("/tok"), Path("/out"))
    assert cfg["server"] == {
        "type": "vllm",
        "model_name": target.model,
        "base_url": "http://127.0.0.1:9/openai",
        "api_key": "k",
    }
    assert cfg["load"]["stages"] == [{"num_requests": 1000, "concurrency_level": 16}]  # type: ignore[index]
    assert cfg["api"] == {"type": "chat", "streaming": True}
    stage = {
        "successes": {
            "count": 990,
            "latency": {
                "time_to_first_token": {"median": 0.002, "p99": 0.01},
                "request_latency": {"median": 0.003, "p99": 0.02},
            },
            "throughput": {"requests_per_sec": 950.0},
        },
        "failures": {"count": 10, "by_label": {"503": {"count": 10}}},
    }
    summary = summarise_inference_perf(stage, 1000)
    assert summary["requests"] == 1000 and summary["errors"] == 10 and summary["capped"] is True
    assert summary["first_token_ms"] == {"p50": 2.0, "p99": 10.0} and summary["final_ms"] == {"p50": 3.0, "p99": 20.0}


def test_the_peers_configs_name_the_upstream() -> None:
    tz = tomllib.loads(tensorzero_config("http://127.0.0.1:5/v1"))
    assert tz["models"]["det"]["providers"]["upstream"]["api_base"] == "http://127.0.0.1:5/v1/"
    assert tz["gateway"]["observability"]["enabled"] is False
    litellm = yaml.safe_load(litellm_config("http://127.0.0.1:5/v1"))
    assert litellm["model_list"][0]["litellm_params"] == {
        "model": "openai/det",
        "api_base": "http://127.0.0.1:5/v1",
        "api_key": "none",
    }


def test_a_python_new_enough_is_found_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMBUS_PEER_PYTHON", sys.executable)
    found = peer_venvs.python_at_least(sys.version_info[:2])
    assert found is not None
    assert subprocess.run(
        [found, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    ).stdout
    assert peer_venvs.python_at_least((3, 99)) is None


def test_profile_helpers_count_per_request_and_keep_the_written_analysis(tmp_path: Path) -> None:
    assert peer_profile.per_request({"a": 10, "b": 5}, {"a": 30, "b": 5, "c": 4, "info": 9}, 4) == {"a": 5.0, "c": 1.0}
    page = tmp_path / "p.md"
    page.write_text(
        f"# Analysis\n\nwritten by hand\n\n{peer_profile.TABLES_BEGIN}\nold\n{peer_profile.TABLES_END}\n\nmore\n"
    )
    peer_profile.update_page(page, f"{peer_profile.TABLES_BEGIN}\nnew\n{peer_profile.TABLES_END}")
    text = page.read_text()
    assert "written by hand" in text and "new" in text and "old" not in text and text.endswith("more\n")
    with cpu_profiled(str(tmp_path / "prof"), "svc"):
        sum(i * i for i in range(200_000))
    [pstat] = (tmp_path / "prof").glob("*.pstat")
    summary = peer_profile.summarise_profile(pstat, requests=10)
    assert summary["profiled_cpu_s"] > 0 and 99 <= sum(summary["packages"].values()) <= 101  # type: ignore[arg-type]
    assert summary["top_functions"] and "calls_per_request" in summary["top_functions"][0]  # type: ignore[index]


def test_a_cpu_window_counts_children_only_for_the_roles_named(tmp_path: Path) -> None:
    burnt = tmp_path / "burnt"
    code = (
        "import time, pathlib\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
        f"pathlib.Path({str(burnt)!r}).touch()\ntime.sleep(60)"
    )
    me = psutil.Process().pid
    window = CpuWindow({"with": me, "without": me}, with_children={"with"})
    window.start()
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not burnt.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu_s = window.stop()["cpu_s"]
    finally:
        child.kill()
        child.wait(timeout=10)
    assert cpu_s["with"] - cpu_s["without"] >= 0.3  # type: ignore[index]  # the child's 0.4 s (and its start)


def test_profiled_code_is_labelled_by_where_it_lives() -> None:
    from bench.cpu_profile_summary import BUILTINS, package_of

    venv = "/root/.cache/llmbus/venv/lib/python3.11/site-packages"  # a venv under a directory called llmbus
    assert package_of(f"{venv}/aiokafka/conn.py") == "aiokafka"
    assert package_of(f"{venv}/redis/connection.py") == "redis-py"
    assert package_of(f"{venv}/starlette/requests.py") == "starlette"  # unlisted: its own package name
    assert package_of("/t/scripts/pythonpath/llmbus_services/gateway/handlers.py") == "gateway"  # a checkout's path
    assert package_of("/t/services/engine_worker/handlers.py") == "engine-worker"
    assert package_of("/t/libs/common/llmbus/state/redis_batch.py") == "llmbus.state (Redis markers, batching)"
    assert package_of("/usr/lib/python3.11/enum.py") == "other stdlib"
    assert package_of("isinstance") == BUILTINS


def test_monitor_lines_are_counted_by_the_service_that_sent_them() -> None:
    ns = "t0123456789."
    output = "\n".join(
        [
            "OK",
            f'1733349000.1 [0 127.0.0.1:5001] "GET" "llmbus:{ns}gateway:apikey:{"ab" * 32}"',
            f'1733349000.2 [0 127.0.0.1:5002] "EVALSHA" "f00d" "1" "llmbus:{ns}router:bucket:acme"',
            f'1733349000.3 [0 lua] "HMGET" "llmbus:{ns}router:bucket:acme" "tokens"',
            f'1733349000.4 [0 127.0.0.1:5001] "GET" "llmbus:{ns}gateway:apikey:{"cd" * 32}"',
            '1733349000.5 [0 127.0.0.1:9999] "INFO"',  # not one of ours: not counted
        ]
    )
    calls = peer_profile.redis_calls_by_role(output, {5001: "gateway", 5002: "router"}, ns)
    assert calls == {
        "gateway get llmbus:<ns>gateway:apikey:*": 2,
        "router evalsha llmbus:<ns>router:bucket:acme": 1,
        "lua hmget llmbus:<ns>router:bucket:acme": 1,
    }


def test_hops_are_record_times_less_the_last_stage_s_over_the_requests_every_stage_saw() -> None:
    stages = ("requests", "routed", "dispatch", "chunk", "result")
    sent = [peer_hops.Sent(f"r{i}", 1000.0 * i, 1000.0 * i + 20.0, None) for i in range(3)]
    sent.append(peer_hops.Sent("r3", 3000.0, None, "HTTP 503"))
    times = {stage: {f"r{i}": 1000.0 * i + 3.0 * (k + 1) + i for i in range(4)} for k, stage in enumerate(stages)}
    del times["routed"]["r2"]  # a request a stage missed is left out
    rows, end_to_end, matched = peer_hops.hop_table(sent, times)
    assert matched == 2 and end_to_end == [20.0, 20.0]
    assert [(r["hop"], r["p50"]) for r in rows] == [
        ("gateway", 3.0),  # nearest rank of [3, 4]
        ("router", 3.0),
        ("scheduler", 3.0),
        ("worker", 3.0),
        ("gateway reply", 7.0),  # 20 - 12 - i
        ("(after: result)", 3.0),
    ]


async def test_the_hops_client_keeps_wall_clock_times_in_order(upstream_url: str) -> None:
    target = Target("upstream direct", upstream_url, "det", {})
    before_ms = time.time() * 1000
    sent = await peer_hops.one_at_a_time(target, 5, 16, "t")
    assert all(s.error is None and s.request_id is None for s in sent)  # the upstream sends no x-request-id
    assert all(before_ms <= s.sent_ms < s.first_token_ms <= time.time() * 1000 for s in sent)  # type: ignore[operator]
