"""`make compose-up` and `make compose-smoke`: the compose stack on a real Docker engine.

    python deploy/compose/stack.py up      engine, images, the whole secured stack, healthy; left running
    python deploy/compose/stack.py smoke   the same under its own project and free ports, then through the
                                           gateway with the official `openai` SDK a streamed and a plain
                                           chat, `llmbus trace`, `llmbus status`, `llmbus costs` (the
                                           requests billed), Redis SIGKILLed losing no key, Prometheus
                                           scraping every target, a scale-up by the autoscaler under a
                                           burst and back down; then `down -v`
    python deploy/compose/stack.py down    `down -v` of the `up` stack, and the engine if this script started it

Every step prints its duration; a failed step prints the state and logs of the services that failed.
Runs with the project's venv (openai, redis); needs root only when no Docker engine runs yet.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("LLMBUS_CACHE", Path.home() / ".cache" / "llmbus"))
FILES = ["-f", str(HERE / "docker-compose.yml"), "-f", str(HERE / "local-images.yml")]
# The ports the stack binds, after its one-digit prefix (docker-compose.yml, deploy/prometheus/prometheus.yml).
PORT_SUFFIXES = [
    "9092",
    "9093",
    "6379",
    "8000",
    "9090",
    "9101",
    "9102",
    "9104",
    "9105",
    "9106",
    "4317",
    "4318",
    "8888",
] + [f"91{n}" for n in (11, 12, 13, 14, 15, 21, 22, 23, 24)]
WORKER_METRICS = {
    "sim-strong-1": "9111",
    "sim-default-1": "9112",
    "sim-mid-1": "9113",
    "sim-small-1": "9114",
    "sim-1": "9115",
}
ONE_SHOT = {"kafka-format", "topics", "secrets-init", "cli"}
TIMINGS: list[tuple[str, float]] = []


class StepFailed(RuntimeError):
    pass


def say(text: str) -> None:
    print(text, flush=True)


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    say(f"==> {name}")
    started = time.monotonic()
    yield
    took = time.monotonic() - started
    TIMINGS.append((name, took))
    say(f"    ok in {took:.1f} s")


def run(
    cmd: list[str], *, env: dict[str, str] | None = None, timeout_s: float = 600, check: bool = True, show: bool = False
) -> str:
    """The command's output; `show`: passed through as it comes (long steps show their progress)."""
    capture = None if show else subprocess.PIPE
    done = subprocess.run(
        cmd,
        env=env,
        stdout=capture,
        stderr=capture,
        text=True,
        timeout=timeout_s,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if check and done.returncode != 0:
        output = f"{(done.stdout or '')[-3000:]}{(done.stderr or '')[-3000:]}"
        raise StepFailed(f"{' '.join(cmd[:6])} … exited {done.returncode}:\n{output}")
    return done.stdout or ""


def wait_for(
    what: str, ready: Callable[[], bool], timeout_s: float, fail: Callable[[], str | None] = lambda: None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        if reason := fail():
            raise StepFailed(f"{what}: {reason}")
        time.sleep(1.0)
    raise StepFailed(f"{what}: not after {timeout_s:.0f} s")


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_prefix() -> str:
    for prefix in "2345":
        if all(port_free(int(prefix + suffix)) for suffix in PORT_SUFFIXES):
            return prefix
    raise StepFailed("no port prefix (2-5) with all the stack's ports free on 127.0.0.1")


def compose_binary() -> list[str]:
    """LLMBUS_COMPOSE if set; else compose v2 (plugin, or built from its Go module into the cache), else
    Debian's docker-compose 1.29 (installed when nothing else is there and we are root)."""
    if chosen := os.environ.get("LLMBUS_COMPOSE"):
        return chosen.split()
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        return ["docker", "compose"]
    built = CACHE / "bin" / "docker-compose"
    if not built.exists() and shutil.which("go"):
        with step("compose v2 from its Go module (once)"):
            run([str(HERE / "compose-v2.sh")], timeout_s=900, show=True)
    if built.exists():
        return [str(built)]
    if not shutil.which("docker-compose") and os.geteuid() == 0:
        with step("Debian's docker-compose (no Go toolchain for compose v2)"):
            run(
                ["apt-get", "install", "-y", "-qq", "docker-compose"],
                env=os.environ | {"DEBIAN_FRONTEND": "noninteractive"},
            )
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise StepFailed("neither compose v2 nor docker-compose is installed")


class Stack:
    def __init__(self, project: str, prefix: str, secrets_dir: Path) -> None:
        self.project = project
        self.prefix = prefix
        self.secrets_dir = secrets_dir
        self.env = os.environ | {"LLMBUS_PORT_PREFIX": prefix, "LLMBUS_SECRETS_DIR": str(secrets_dir)}
        self.compose = [*compose_binary(), "-p", project, *FILES]

    def __call__(self, *args: str, timeout_s: float = 600, check: bool = True, show: bool = False) -> str:
        return run([*self.compose, *args], env=self.env, timeout_s=timeout_s, check=check, show=show)

    def port(self, suffix: str) -> int:
        return int(self.prefix + suffix)

    def containers(self) -> dict[str, dict[str, Any]]:
        """Service name → the engine's state of its container (status, health, exit code)."""
        ids = self("ps", "-a", "-q").split()
        if not ids:
            return {}
        inspected = json.loads(run(["docker", "inspect", *ids]))
        return {c["Config"]["Labels"]["com.docker.compose.service"]: c["State"] for c in inspected}

    def failed_services(self) -> list[str]:
        failed = []
        for name, state in self.containers().items():
            health = state.get("Health", {}).get("Status")
            exited_badly = state["Status"] == "exited" and (name not in ONE_SHOT or state["ExitCode"] != 0)
            if exited_badly or state.get("Restarting") or health == "unhealthy" or state.get("RestartCount", 0):
                failed.append(name)
        return failed

    def print_failures(self) -> None:
        say(self("ps", "-a", check=False))
        failed = self.failed_services() or [name for name in self.containers() if name not in ONE_SHOT]
        for name in failed:
            say(f"---- logs of {name} (last 60 lines)")
            say(self("logs", "--no-color", "--tail", "60", name, check=False))

    def cli(self, *args: str) -> str:
        """An `llmbus` command in the image, as the operator principal."""
        return self("run", "--rm", "-T", "-e", "COLUMNS=160", "cli", "llmbus", *args, timeout_s=120)

    def up(self) -> None:
        with step("secrets (secrets-init: one password per principal)"):
            self("run", "--rm", "-T", "secrets-init")
        with step("up -d: Kafka, Redis, topics + ACLs, 6 services, 5 sim workers, autoscaler, Prometheus, collector"):
            self("up", "-d", "--no-build", timeout_s=600, show=True)
        with step("healthy: gateway ready, every worker ready, every service's /metrics answers"):
            wait_for("gateway healthy", self.gateway_healthy, 180, self.fail_reason)
            for worker, suffix in WORKER_METRICS.items():
                wait_for(f"{worker} ready", functools.partial(self.worker_ready, suffix), 120, self.fail_reason)
            for suffix in ("9101", "9102", "9104", "9105", "9106"):
                wait_for(f"/metrics on {self.port(suffix)}", functools.partial(self.metrics_answer, suffix), 60)

    def metrics_answer(self, suffix: str) -> bool:
        return metric_text(self.port(suffix)) != ""

    def fail_reason(self) -> str | None:
        failed = self.failed_services()
        return f"failed: {', '.join(failed)}" if failed else None

    def gateway_healthy(self) -> bool:
        state = self.containers().get("gateway", {})
        return bool(state.get("Health", {}).get("Status") == "healthy")

    def worker_ready(self, suffix: str) -> bool:
        return any(
            line.startswith("llmbus_worker_ready{") and line.endswith(" 1.0")
            for line in metric_text(self.port(suffix)).splitlines()
        )

    def down(self) -> None:
        with step("down -v"):
            self("down", "-v", "--remove-orphans", timeout_s=300, show=True)


def metric_text(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as answer:
            return str(answer.read().decode())
    except OSError:
        return ""


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())


def prepare() -> bool:
    """Engine and images; True when this run started the engine (so it stops it after)."""
    with step("Docker engine (running one, or dockerd without bridge or firewall rules)"):
        was_running = (
            subprocess.run([str(HERE / "engine.sh"), "status"], capture_output=True, check=False).returncode == 0
        )
        run([str(HERE / "engine.sh"), "start"], show=True)
    with step("images: debian base (debootstrap if missing), llmbus, Kafka, Redis, Prometheus, collector"):
        run([str(HERE / "images.sh")], timeout_s=1800, show=True)
    return not was_running


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


def burst_scales_up_and_down(stack: Stack, api_key: str, requests: int = 40) -> None:
    """The autoscaler (burst policy) adds a sim-llama-8b worker while a burst queues, then removes it."""
    import asyncio

    from openai import AsyncOpenAI

    added = stack.port("9121")  # the first worker the autoscaler starts serves /metrics here

    async def burst() -> int:
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{stack.port('8000')}/v1", api_key=api_key, timeout=300)

        async def one(n: int) -> int:
            answer = await client.chat.completions.create(
                model="sim-llama-8b",
                messages=[{"role": "user", "content": f"Burst request {n}: count the partitions of a topic."}],
                max_tokens=48,
            )
            return len(answer.choices[0].message.content or "")

        lengths = await asyncio.gather(*(one(n) for n in range(requests)))
        await client.close()
        return sum(1 for length in lengths if length)

    with step(f"autoscaler: a burst of {requests} requests queues on one sim worker → a worker added"):
        answered = 0

        def scaled_up() -> bool:
            return any(
                line.startswith("llmbus_worker_ready{") and line.endswith(" 1.0")
                for line in metric_text(added).splitlines()
            )

        async def burst_and_watch() -> None:
            nonlocal answered
            task = asyncio.create_task(burst())
            deadline = time.monotonic() + 180
            while not scaled_up():
                if time.monotonic() > deadline:
                    raise StepFailed(f"no worker added on 127.0.0.1:{added} within 180 s")
                if task.done() and task.exception():
                    raise StepFailed(f"burst failed: {task.exception()!r}")
                await asyncio.sleep(1.0)
            answered = await task

        asyncio.run(burst_and_watch())
        if answered != requests:
            raise StepFailed(f"{answered} of {requests} burst requests answered")
        say(f"    worker sim-llama-8b-as1 ready (/metrics on {added}); {answered} of {requests} answered")
    keda_queries_evaluate(stack)
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
        kinds = {kind: sum(kind in key.decode() for key in before) for kind in (":apikey:", ":final:", "cost:seen:")}
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


def prometheus_scrapes(stack: Stack) -> None:
    with step("Prometheus: every llmbus target up, alert rules loaded"):
        url = f"http://127.0.0.1:{stack.port('9090')}/api/v1"
        down: list[str] = []

        def all_up() -> bool:
            nonlocal down
            targets = http_json(f"{url}/targets")["data"]["activeTargets"]
            mine = [t for t in targets if t["labels"]["job"] == "llmbus"]
            down = [t["labels"]["instance"] for t in mine if t["health"] != "up"]
            return len(mine) == 11 and not down

        wait_for("every llmbus target up", all_up, 60, lambda: None)
        collector = [
            t for t in http_json(f"{url}/targets")["data"]["activeTargets"] if t["labels"]["job"] == "otel-collector"
        ]
        if not collector or collector[0]["health"] != "up":
            raise StepFailed(f"the collector's metrics are not scraped: {collector}")
        rules = [r["name"] for g in http_json(f"{url}/rules")["data"]["groups"] for r in g["rules"]]
        if len(rules) < 6:
            raise StepFailed(f"alert rules loaded: {rules}")
        say(f"    11 llmbus targets and the collector up; rules: {', '.join(rules)}")


def keda_queries_evaluate(stack: Stack) -> None:
    """Each KEDA ScaledObject's PromQL (deploy/k8s/keda/) on this stack's Prometheus, right after a burst
    queued: it must evaluate to a number above its threshold (KEDA would scale out)."""
    import urllib.parse

    import yaml

    with step("KEDA ScaledObjects' PromQL on the stack's Prometheus after the burst: above threshold"):
        for path in sorted((HERE.parent / "k8s" / "keda").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                for trigger in (doc or {}).get("spec", {}).get("triggers", []):
                    query, threshold = trigger["metadata"]["query"], float(trigger["metadata"]["threshold"])
                    url = f"http://127.0.0.1:{stack.port('9090')}/api/v1/query?query={urllib.parse.quote(query)}"
                    values: list[float] = []

                    def evaluated(url: str = url, values: list[float] = values, threshold: float = threshold) -> bool:
                        result = http_json(url)["data"]["result"]
                        values[:] = [float(r["value"][1]) for r in result]
                        return any(v > threshold for v in values)

                    wait_for(f"{path.name}: {query} > {threshold}", evaluated, 30)
                    say(f"    {path.name}: {values[0]:.2f} > {threshold} ({doc['metadata']['name']})")


def smoke() -> None:
    started_engine = prepare()
    secrets_dir = Path(tempfile.mkdtemp(prefix="llmbus-smoke-secrets."))
    # The autoscaler's policy in seconds and a small batch on the sim worker, so a burst shows scaling.
    os.environ |= {"LLMBUS_AUTOSCALER_POOLS": "burst", "LLMBUS_SIM_MAX_NUM_SEQS": "2"}
    stack = Stack("llmbus-smoke", free_prefix(), secrets_dir)
    say(f"    compose: {' '.join(stack.compose[: stack.compose.index('-p')])}; ports 127.0.0.1:{stack.prefix}xxxx")
    try:
        stack("config", "-q")
        stack.up()
        with step("API key for tenant acme (llmbus keys create)"):
            api_key = stack.cli("keys", "create", "--tenant", "acme", "--name", "smoke").strip().splitlines()[-1]
        request_id = chats(stack, api_key)
        traced(stack, request_id)
        spans_reach_the_collector(stack, api_key)
        with step("llmbus status: every tier's worker ready"):
            status = stack.cli("status")
            if missing := [w for w in WORKER_METRICS if w not in status]:
                raise StepFailed(f"workers missing from llmbus status: {missing}\n{status}")
        billed(stack, "acme", 2)
        redis_restart_keeps_keys(stack, api_key)
        prometheus_scrapes(stack)
        burst_scales_up_and_down(stack, api_key)
    except BaseException:
        say("!!! smoke failed; state and logs of the failed services:")
        with contextlib.suppress(Exception):
            stack.print_failures()
        raise
    finally:
        with contextlib.suppress(Exception):
            stack.down()
        shutil.rmtree(secrets_dir, ignore_errors=True)
        if started_engine:
            run([str(HERE / "engine.sh"), "stop"], check=False)
    report()


def report() -> None:
    total = sum(took for _, took in TIMINGS)
    say("\nstep timings (s):")
    for name, took in TIMINGS:
        say(f"  {took:7.1f}  {name}")
    say(f"  {total:7.1f}  total")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "smoke", "down"])
    action = parser.parse_args().action
    try:
        if action == "smoke":
            smoke()
            return
        prefix = os.environ.get("LLMBUS_PORT_PREFIX", "2")
        stack = Stack("llmbus", prefix, Path(os.environ.get("LLMBUS_SECRETS_DIR", HERE / "secrets")))
        if action == "down":
            stack.down()
            run([str(HERE / "engine.sh"), "stop"], check=False)
            return
        prepare()
        running = stack("ps", "-q").split()
        if not running and (busy := [p for p in PORT_SUFFIXES if not port_free(int(prefix + p))]):
            raise StepFailed(f"ports 127.0.0.1:{prefix}{busy[0]} and others in use; set LLMBUS_PORT_PREFIX (2-5)")
        try:
            stack.up()
        except BaseException:
            stack.print_failures()
            raise
        report()
        say(
            f"\nthe stack is up: gateway http://127.0.0.1:{stack.port('8000')}/v1, Prometheus "
            f"http://127.0.0.1:{stack.port('9090')}, Kafka 127.0.0.1:{stack.port('9092')} (SASL/SCRAM).\n"
            f"  docker compose -p llmbus {' '.join(FILES)} run --rm cli llmbus status\n"
            "  make compose-down   (removes the stack and its volumes)"
        )
    except StepFailed as failure:
        say(f"FAILED: {failure}")
        sys.exit(1)


if __name__ == "__main__":
    main()
