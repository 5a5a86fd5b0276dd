"""What the compose smoke checks on a running stack (stack.py smoke), one timed step each."""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.error
import urllib.request
from typing import Any

import yaml
from project import HERE, Stack
from steps import StepFailed, http_json, metric_text, say, step, wait_for


def chats(stack: Stack, api_key: str) -> str:
    """Both chats; the plain one's llmbus request id (the gateway's x-request-id header)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{stack.port('8000')}/v1", api_key=api_key, timeout=120, max_retries=0)
    with step("openai SDK: streamed chat through the gateway"):
        stream = client.chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": "What does a control plane for LLM inference do?"}],
            max_tokens=32,
            stream=True,
        )
        deltas = [c.choices[0].delta.content or "" for c in stream if c.choices]
        text = "".join(deltas)
        if len([d for d in deltas if d]) < 2 or not text.strip():
            raise StepFailed(f"streamed answer too short: {deltas!r}")
        say(f"    {len(deltas)} chunks: {text[:80]!r}")
    with step("openai SDK: non-streamed chat through the gateway"):
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "Say hello to the operators."}], max_tokens=16
        )
        completion = raw.parse()
        answer = completion.choices[0].message.content or ""
        if not answer.strip() or completion.usage is None or completion.usage.completion_tokens < 1:
            raise StepFailed(f"empty answer: {completion!r}")
        say(f"    model {completion.model}, {completion.usage.completion_tokens} tokens: {answer[:80]!r}")
    return str(raw.headers["x-request-id"])


def spans_reach_the_collector(stack: Stack, api_key: str) -> None:
    """A chat carrying the caller's traceparent: every hop's span of that trace reaches the collector."""
    import secrets

    from openai import OpenAI

    trace_id = secrets.token_hex(16)
    client = OpenAI(base_url=f"http://127.0.0.1:{stack.port('8000')}/v1", api_key=api_key, timeout=120, max_retries=0)
    with step("OpenTelemetry: a chat's spans, gateway to worker, in the collector under the caller's trace id"):
        client.chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": "Trace this request end to end."}],
            max_tokens=8,
            extra_headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
        )
        names: list[str] = []

        def collected() -> bool:
            logs = stack("logs", "--no-color", "otel-collector")
            # The debug exporter's lines: `<span name> <trace id> <span id> <attributes>`, the first of a
            # batch after the log prefix (tab separated), all behind compose's `<service> | `.
            names[:] = [
                re.split(r"\t|\| ", line.split(f" {trace_id} ")[0])[-1].strip()
                for line in logs.splitlines()
                if f" {trace_id} " in line
            ]
            return len(names) >= 6

        wait_for(f"spans of trace {trace_id} in the collector", collected, 60)
        say(f"    {len(names)} spans of trace {trace_id}: {', '.join(sorted(set(names)))}")


def traced(stack: Stack, request_id: str) -> None:
    with step("llmbus trace: the request's hops from the topics (routed, attempt on a worker, result)"):
        lines = stack.cli("trace", request_id, "--since-minutes", "30", "--timeout-s", "60")
        for wanted in ("routed: ->", "attempt 1: worker", "result: ok"):
            if wanted not in lines:
                raise StepFailed(f"no '{wanted}' in the trace of {request_id}:\n{lines}")
        say("    " + "\n    ".join(line for line in lines.splitlines() if line.strip())[:800])


def burst_scales_up_and_down(stack: Stack, api_key: str, prometheus: dict[str, str], clients: int = 40) -> None:
    """The autoscaler (burst policy) adds a sim-llama-8b worker while a burst queues, then removes it;
    right after the burst, the KEDA queries (p99 TTFT over 2 s, p99 queue wait over 0.5 s) are evaluated
    on each Prometheus (name → port suffix).

    The burst is sustained: each of `clients` callers sends one request after another until the added
    worker reports ready. A fixed number of requests drains in about the policy's `up_after_s` on the
    sim worker (40 requests of 48 tokens at 2 sequences: 3 to 6 s), so whether it scaled would depend
    on timing."""
    import asyncio

    from openai import AsyncOpenAI

    added = stack.port("9121")  # the first worker the autoscaler starts serves /metrics here

    def scaled_up() -> bool:
        return any(
            line.startswith("llmbus_worker_ready{") and line.endswith(" 1.0")
            for line in metric_text(added).splitlines()
        )

    async def burst_until_scaled(deadline_s: float) -> tuple[int, int]:
        """(requests sent, requests answered with text) once the added worker is ready."""
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{stack.port('8000')}/v1", api_key=api_key, timeout=300)
        done = asyncio.Event()
        sent = answered = 0

        async def caller(n: int) -> None:
            nonlocal sent, answered
            while not done.is_set():
                sent += 1
                answer = await client.chat.completions.create(
                    model="sim-llama-8b",
                    messages=[{"role": "user", "content": f"Burst request {n}.{sent}: count the partitions."}],
                    max_tokens=48,
                )
                answered += bool(answer.choices[0].message.content)

        callers = asyncio.gather(*(caller(n) for n in range(clients)))
        deadline = time.monotonic() + deadline_s
        try:
            while not await asyncio.to_thread(scaled_up):
                if time.monotonic() > deadline:
                    raise StepFailed(f"no worker added on 127.0.0.1:{added} within {deadline_s:.0f} s ({sent} sent)")
                if callers.done() and callers.exception():
                    raise StepFailed(f"burst failed: {callers.exception()!r}")
                await asyncio.sleep(1.0)
            done.set()
            await callers
        finally:
            done.set()
            if not callers.done():
                callers.cancel()
                with contextlib.suppress(BaseException):
                    await callers
            await client.close()
        return sent, answered

    with step(f"autoscaler: {clients} callers queue on one sim worker until a worker is added"):
        sent, answered = asyncio.run(burst_until_scaled(180))
        if answered != sent:
            raise StepFailed(f"{answered} of {sent} burst requests answered")
        say(f"    worker sim-llama-8b-as1 ready (/metrics on {added}); {answered} of {sent} answered")
    for which, port_suffix in prometheus.items():
        keda_queries_evaluate(stack, port_suffix, which)
    with step("autoscaler: no traffic → the added worker drained and gone"):
        wait_for(f"worker on {added} gone", lambda: metric_text(added) == "", 180, stack.fail_reason)


def billed(stack: Stack, tenant: str, requests: int) -> None:
    with step(f"llmbus costs: tenant {tenant} billed for {requests} requests"):
        row: dict[str, Any] = {}

        def counted() -> bool:
            nonlocal row
            report = json.loads(stack.cli("costs", "--json", "-"))
            row = report["today"]["tenant"].get(tenant, {})
            return bool(row.get("requests", 0) >= requests and row.get("cost_usd", 0) > 0)

        wait_for("costs", counted, 90)
        say(f"    {row['requests']} requests, ${row['cost_usd']:.6f}")


def redis_restart_keeps_keys(stack: Stack, api_key: str) -> None:
    import redis

    password = (stack.secrets_dir / "redis").read_text().strip()
    client = redis.Redis(port=stack.port("6379"), password=password, socket_timeout=5)
    with step("Redis killed (SIGKILL) and started again: no API key, marker or other lasting key lost"):
        # Keys with no expiry or more than 5 minutes left (short-lived ones may expire during the restart).
        before = {key for key in client.scan_iter(count=1000) if client.ttl(key) == -1 or client.ttl(key) > 300}
        # appendfsync everysec: what was written 2 s before a crash is on disk (one fsync period, plus
        # one more if the previous fsync was still running).
        time.sleep(2.5)
        stack("kill", "-s", "SIGKILL", "redis", timeout_s=60)
        stack("start", "redis", timeout_s=60)
        wait_for("redis healthy", lambda: stack.containers()["redis"].get("Health", {}).get("Status") == "healthy", 60)
        client = redis.Redis(port=stack.port("6379"), password=password, socket_timeout=5)
        lost = [key for key in before if not client.exists(key)]
        if lost:
            raise StepFailed(f"{len(lost)} of {len(before)} keys lost, e.g. {lost[:5]}")
        # Cost-accounting's markers live under one hash tag: `{<prefix>cost}:seen:…` (llmbus.state.keys).
        kinds = {kind: sum(kind in key.decode() for key in before) for kind in (":apikey:", "}:final", "cost}:seen:")}
        if not all(kinds.values()):
            raise StepFailed(f"expected API keys, final markers and cost markers before the restart: {kinds}")
        say(f"    {len(before)} keys kept (API keys, final markers, cost markers: {list(kinds.values())})")
        from openai import OpenAI

        client_ai = OpenAI(base_url=f"http://127.0.0.1:{stack.port('8000')}/v1", api_key=api_key, timeout=120)
        answer = client_ai.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Still there?"}], max_tokens=8
        )
        if not (answer.choices[0].message.content or "").strip():
            raise StepFailed("no answer with the API key after the restart")
        say("    the API key still authenticates: answered")


def llmbus_targets() -> int:
    """How many targets the stack's Prometheus scrapes in its `llmbus` job (deploy/prometheus/prometheus.yml)."""
    config = yaml.safe_load((HERE.parent / "prometheus" / "prometheus.yml").read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "llmbus"]
    return sum(len(group["targets"]) for group in job["static_configs"])


LLMBUS_TARGETS = llmbus_targets()
TTFT_METRIC = "llmbus_scheduler_time_to_first_token_seconds"  # the scheduler's TTFT histogram, KEDA's latency trigger


def prometheus_scrapes(stack: Stack, port_suffix: str = "9090", which: str = "Prometheus") -> None:
    with step(f"{which}: every llmbus target up, alert rules loaded"):
        url = f"http://127.0.0.1:{stack.port(port_suffix)}/api/v1"
        down: list[str] = []
        found: list[str] = []

        def all_up() -> bool:
            nonlocal down, found
            targets = http_json(f"{url}/targets")["data"]["activeTargets"]
            mine = [t for t in targets if t["labels"]["job"] == "llmbus"]
            found = [t["labels"]["instance"] for t in mine]
            down = [t["labels"]["instance"] for t in mine if t["health"] != "up"]
            return len(mine) == LLMBUS_TARGETS and not down

        try:
            wait_for("every llmbus target up", all_up, 60)
        except StepFailed as exc:
            raise StepFailed(f"{exc}; {len(found)} of {LLMBUS_TARGETS} targets listed, down: {down}") from None
        collector = [
            t for t in http_json(f"{url}/targets")["data"]["activeTargets"] if t["labels"]["job"] == "otel-collector"
        ]
        if not collector or collector[0]["health"] != "up":
            raise StepFailed(f"the collector's metrics are not scraped: {collector}")
        rules = [r["name"] for g in http_json(f"{url}/rules")["data"]["groups"] for r in g["rules"]]
        if len(rules) < 6:
            raise StepFailed(f"alert rules loaded: {rules}")
        say(f"    {LLMBUS_TARGETS} llmbus targets and the collector up; rules: {', '.join(rules)}")


def keda_queries_evaluate(stack: Stack, port_suffix: str, which: str) -> None:
    """Each KEDA ScaledObject's PromQL (deploy/k8s/keda/) on a Prometheus of the stack, right after a burst
    queued: every trigger must evaluate to a number above its threshold (KEDA would scale out), and the
    latency trigger (p99 TTFT, the scheduler's llmbus_scheduler_time_to_first_token_seconds) must be one
    of them."""
    import urllib.parse

    with step(f"KEDA ScaledObjects' PromQL (p99 TTFT, p99 queue wait) on {which} after the burst: above threshold"):
        for path in sorted((HERE.parent / "k8s" / "keda").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                triggers = (doc or {}).get("spec", {}).get("triggers", [])
                if doc and not any(TTFT_METRIC in t["metadata"]["query"] for t in triggers):
                    raise StepFailed(f"{path.name}: no trigger on {TTFT_METRIC}")
                for trigger in triggers:
                    query, threshold = trigger["metadata"]["query"], float(trigger["metadata"]["threshold"])
                    url = f"http://127.0.0.1:{stack.port(port_suffix)}/api/v1/query?query={urllib.parse.quote(query)}"
                    values: list[float] = []

                    def evaluated(url: str = url, values: list[float] = values, threshold: float = threshold) -> bool:
                        result = http_json(url)["data"]["result"]
                        values[:] = [float(r["value"][1]) for r in result]
                        return any(v > threshold for v in values)

                    wait_for(f"{path.name}: {query} > {threshold}", evaluated, 30)
                    name = f"{doc['metadata']['name']} {trigger.get('name', '')}"
                    say(f"    {path.name}: {values[0]:.2f} > {threshold} ({name})")


def table_cells(html: str, table_id: str) -> list[list[str]]:
    """The data rows of a console's table (header left out), each as its cells' text; a table
    without data has one row of one cell, "no data"."""
    table = re.search(rf'<table id="{table_id}">(.*?)</table>', html, re.S)
    if table is None:
        raise StepFailed(f"the console has no table {table_id}")
    rows = re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)[1:]
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]


# Per console, the tables that must have a filled row after the smoke's traffic, and the column that
# must not be empty in it (the chats, a session turn and a feedback sent just before).
CONSOLE_DATA = {
    "llmbus-infrastructure.html": {"targets": 2, "workers": 1},
    "llmbus-quality.html": {"feedback": 1, "results": 1},
    "llmbus-experience.html": {"latency": 2, "session-turns": 2},
}


def session_turn_and_feedback(stack: Stack, api_key: str) -> None:
    """A session turn and a feedback through the gateway: what the quality and experience layers show."""
    from openai import OpenAI

    with step("a session turn and its feedback through the gateway"):
        client = OpenAI(
            base_url=f"http://127.0.0.1:{stack.port('8000')}/v1", api_key=api_key, timeout=120, max_retries=0
        )
        raw = client.chat.completions.with_raw_response.create(
            model="auto",
            messages=[{"role": "user", "content": "One turn of a session."}],
            max_tokens=8,
            extra_headers={"x-llmbus-session-id": "smoke-session"},
        )
        feedback = urllib.request.Request(
            f"http://127.0.0.1:{stack.port('8000')}/v1/feedback",
            data=json.dumps({"request_id": raw.headers["x-request-id"], "score": 0.9}).encode(),
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(feedback, timeout=10) as answer:
            if answer.status != 202:
                raise StepFailed(f"feedback answered {answer.status}")


def consoles_render(stack: Stack, port_suffix: str, which: str) -> None:
    """The three dashboard layers (deploy/prometheus/consoles/) from a Prometheus of the stack, after the
    smoke's chats, session turn and feedback: each console must render (HTTP 200) with data in each of
    its layer's tables."""
    with step(f"{which} consoles: the three dashboard layers render with data"):
        for name, tables in CONSOLE_DATA.items():
            url = f"http://127.0.0.1:{stack.port(port_suffix)}/consoles/{name}"
            empty: list[str] = []

            def filled(
                url: str = url, name: str = name, tables: dict[str, int] = tables, empty: list[str] = empty
            ) -> bool:
                try:
                    with urllib.request.urlopen(url, timeout=10) as answer:
                        html = answer.read().decode()
                except urllib.error.HTTPError as error:  # a template error is answered 500, its text the body
                    raise StepFailed(f"{name}: HTTP {error.code}: {error.read().decode()[:2000]}") from None
                empty[:] = [
                    table
                    for table, column in tables.items()
                    if not any(len(row) > column and row[column] for row in table_cells(html, table))
                ]
                return not empty

            try:
                wait_for(f"{name}: tables with data", filled, 60, lambda: None)
            except StepFailed as failure:
                raise StepFailed(f"{failure}; still empty: {', '.join(empty)}") from None
            say(f"    {name}: {', '.join(tables)} filled")
