"""The whole pipeline under load: router → scheduler → one engine-worker, on the real broker.

Two engines, each in its own fresh topic namespace: `openai-http` against a zero-cost
OpenAI-compatible upstream started here (bench.openai_upstream, 16 tokens per answer), and
the `sim` engine taking no time. Closed-loop clients at each concurrency produce raw JSON onto
llm.requests and read the reply topic; an open-loop replay of the Azure conversation trace
(prompts of hundreds to thousands of tokens) runs at fixed rates against the sim, and its
control-plane queued time (received → engine start, by hop) is read from the window's results
and Dispatches once it ends (bench.pipeline_queued); closed-loop clients asking the sim for
long answers measure token streaming through the bus: tokens/s delivered and each chunk's
delivery time (bench.pipeline_stream). Measured: requests/s, first-token and final-chunk
percentiles (from the client's send), CPU-seconds per request of every process (router,
scheduler, worker, the broker's JVM, the upstream, the client), load average, and that every
request got exactly one final chunk.

`--baseline REV` runs the same matrix on the services of another commit first (exported to a
temporary directory), so before and after are measured side by side in one run.

    python -m bench.pipeline_bench [--quick] [--baseline REV] [--engines openai,sim]
        [--replay-rates 25,100] [--stream-concurrency 16,64 --stream-tokens 512 --stream-s 15]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from bench.pipeline_load import CpuWindow, MakeRequest, PipelineClient, broker_pid, closed_loop, idle, open_loop
from bench.pipeline_queued import WindowRecords, engine_room, summarise_queued
from bench.pipeline_report import summarise, write_reports
from bench.pipeline_stream import stream_window
from bench.traces import AZURE_CONVERSATION
from llmbus.bus.admin import ensure_catalog
from llmbus.contract.messages import InferenceRequest
from llmbus.process.launch import checkout_pythonpath
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import REPO, ServiceProc, drop_namespace, fresh_settings, wait_workers_ready

ANSWER_TOKENS = 16
TENANT = "bench"
WORKER_ID = "w1"  # the one worker of each stack


def bench_policy(directory: Path, tree: Path = REPO) -> Path:
    """`tree`'s default routing policy with a tenant that has no rate limits (the load would trip them)."""
    policy = yaml.safe_load((tree / "services/router/policies/default.yaml").read_text())
    policy["tenants"][TENANT] = policy["tenants"]["default"] | {
        "requests_per_s": 1_000_000,
        "burst_requests": 1_000_000,
        "tokens_per_min": 10**12,
    }
    path = directory / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def export_tree(rev: str, directory: Path) -> Path:
    """The services' code at `rev`, as files (git archive): the baseline runs from there."""
    target = directory / f"tree-{rev.replace('/', '_')}"
    target.mkdir()
    archive = subprocess.run(["git", "archive", rev], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


class Stack:
    """Router, scheduler and one worker (and the upstream for openai-http) in a fresh namespace."""

    def __init__(self, engine: str, tree: Path, policy: Path, log_dir: Path) -> None:
        self.engine = engine
        self.tree = tree
        self.settings: BusSettings = fresh_settings()
        self.policy = policy
        self.log_dir = log_dir
        self.procs: dict[str, ServiceProc] = {}
        self.model = "det" if engine == "openai" else "sim-llama-8b"
        self.upstream_url = ""

    def _proc(self, module: str, name: str, env: dict[str, str], cwd: Path) -> ServiceProc:
        code_env = {"PYTHONPATH": checkout_pythonpath(cwd)}
        proc = ServiceProc(module, self.settings, env=code_env | env, log_dir=self.log_dir, name=name, cwd=cwd)
        self.procs[name] = proc.start()
        return proc

    async def start(self) -> None:
        await ensure_catalog(self.settings)
        worker_env = {"LLMBUS_WORKER_WORKER_ID": WORKER_ID, "LLMBUS_WORKER_MODEL": self.model}
        if self.engine == "openai":
            port = free_port()
            self._proc("bench.openai_upstream", "upstream", {"LLMBUS_BENCH_UPSTREAM_PORT": str(port)}, REPO)
            self.upstream_url = f"http://127.0.0.1:{port}/v1"
            worker_env |= {"LLMBUS_WORKER_ENGINE": "openai-http", "LLMBUS_WORKER_OPENAI_BASE_URL": self.upstream_url}
        else:
            worker_env |= {"LLMBUS_WORKER_ENGINE": "sim", "LLMBUS_WORKER_SIM_SPEEDUP": "0"}
        self._proc("llmbus_services.router", "router", {"LLMBUS_ROUTER_POLICY_PATH": str(self.policy)}, self.tree)
        self._proc("llmbus_services.scheduler", "scheduler", {}, self.tree)
        self._proc("llmbus_services.engine_worker", "worker", worker_env, self.tree)
        await wait_workers_ready(self.settings, {WORKER_ID}, timeout_s=90)

    def pids(self) -> dict[str, int]:
        pids = {name: p.proc.pid for name, p in self.procs.items() if p.proc is not None}
        if (broker := broker_pid(self.settings.kafka_bootstrap)) is not None:
            pids["broker"] = broker
        return pids | {"client": os.getpid()}

    async def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(Exception):
                proc.terminate(30)
        await drop_namespace(self.settings)


def request_maker(model: str, tag: str, prompt_of=None):  # type: ignore[no-untyped-def]
    """Unique prompts (the exact cache would answer repeats), the bench tenant, ANSWER_TOKENS out."""

    def make(i: int) -> InferenceRequest:
        if prompt_of is not None:
            prompt, max_tokens = prompt_of(i)
        else:
            prompt, max_tokens = f"{tag} request {i}: what does a control plane do?", ANSWER_TOKENS
        return InferenceRequest(prompt=prompt, model=model, max_tokens=max_tokens, tenant=TENANT, temperature=0.7)

    return make


def azure_rows(limit: int) -> list[tuple[int, int]]:
    rows = []
    with AZURE_CONVERSATION.open() as f:
        next(f)
        for line in f:
            _, context, generated = line.strip().split(",")
            rows.append((int(context), int(generated)))
            if len(rows) >= limit:
                break
    return rows


async def until_answering(client: PipelineClient, model: str, timeout_s: float = 90) -> None:
    """One request through the whole path (the router reads its state before routing the first)."""
    deadline = time.monotonic() + timeout_s
    make = request_maker(model, "probe")
    i = 0
    while time.monotonic() < deadline:
        sample = await client.call(make(i), 20)
        if sample.error is None:
            return
        i += 1
    raise TimeoutError("the pipeline did not answer")


async def direct_upstream(url: str, requests: int) -> dict[str, object]:
    """The upstream alone, one request at a time: what the pipeline's first token is compared with."""
    first_ms: list[float] = []
    final_ms: list[float] = []
    body = {"model": "det", "stream": True, "max_tokens": ANSWER_TOKENS, "messages": [{"role": "user", "content": "x"}]}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for i in range(requests + 5):
            started = time.perf_counter()
            first = None
            async with http.stream("POST", "/chat/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if first is None and '"content"' in line:
                        first = time.perf_counter()
            if i >= 5 and first is not None:
                first_ms.append((first - started) * 1000)
                final_ms.append((time.perf_counter() - started) * 1000)
    return {"first_token_ms": first_ms, "final_ms": final_ms}


def start_profiles(stack: Stack, args: argparse.Namespace, tag: str, concurrency: int) -> list[subprocess.Popen[bytes]]:
    """py-spy (collapsed stacks) on each service for one closed-loop window, with --profile DIR."""
    if not args.profile or concurrency != args.profile_concurrency:
        return []
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    py_spy = Path(sys.executable).parent / "py-spy"
    duration_s = str(int(args.warmup_s + args.window_s))
    return [
        subprocess.Popen(
            [
                *(str(py_spy), "record", "--pid", str(proc.proc.pid), "--duration", duration_s, "--rate", "200"),
                *("--format", "raw", "--nonblocking", "-o", str(out / f"{tag}-{name}.txt")),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, proc in stack.procs.items()
        if proc.proc is not None and name != "upstream"
    ]


def stream_prompt(tag: str, answer_tokens: int) -> Callable[[int], tuple[str, int]]:
    """A short unique prompt and a long answer (the sim generates exactly max_tokens)."""

    def prompt_of(i: int) -> tuple[str, int]:
        return f"{tag} {i}: tell a long story about a control plane", answer_tokens

    return prompt_of


async def replay_window(
    label: str,
    stack: Stack,
    client: PipelineClient,
    make: MakeRequest,
    rate: float,
    window_s: float,
    cpu: CpuWindow,
    idle_window: dict[str, object],
) -> dict[str, object]:
    """One open-loop window at `rate`; then the window's results and Dispatches give its queued time."""
    records = await WindowRecords(stack.settings, WORKER_ID).start()
    try:
        samples, window = await open_loop(client, make, rate, window_s, cpu)
        results, dispatches = await records.read({s.request_id for s in samples}, timeout_s=30.0)
        heartbeats, pool_stats = await records.read_status()
    finally:
        await records.stop()
    row = summarise(label, stack.engine, f"azure replay {rate:g}/s", samples, window, idle=idle_window)
    row["queued"] = summarise_queued(results, dispatches, len(samples), rate)
    row["room"] = engine_room(heartbeats, pool_stats, stack.model)
    queued: dict[str, object] = row["queued"]  # type: ignore[assignment]
    print(
        f"[{label}] {stack.engine} replay {rate:g}/s: {row['headline']}; queued {queued['queued_ms']} "
        f"({queued['verdict']})",
        file=sys.stderr,
        flush=True,
    )
    return row


async def run_tree(label: str, tree: Path, args: argparse.Namespace, work: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    policy = bench_policy(work)
    for engine in args.engines:
        stack = Stack(engine, tree, policy, work)
        print(f"[{label}] starting {engine} stack ({stack.settings.topic_prefix})", file=sys.stderr, flush=True)
        await stack.start()
        client = await PipelineClient(stack.settings).start()
        try:
            await until_answering(client, stack.model)
            cpu = CpuWindow(stack.pids())
            idle_window = await idle(cpu, args.idle_s)
            rows.append(summarise(label, engine, "idle", [], idle_window))
            print(f"[{label}] {engine} idle CPU: {rows[-1]['cpu_utilisation']}", file=sys.stderr, flush=True)
            if engine == "openai" and label == "after":
                direct = await direct_upstream(stack.upstream_url, args.direct_requests)
                rows.append(summarise(label, engine, "upstream direct, c=1", [], {}, direct=direct))  # type: ignore[arg-type]
            for concurrency in args.concurrency:
                make = request_maker(stack.model, f"{label}-{engine}-c{concurrency}")
                profiling = start_profiles(stack, args, f"{label}-{engine}-c{concurrency}", concurrency)
                samples, window = await closed_loop(client, make, concurrency, args.warmup_s, args.window_s, cpu)
                for spy in profiling:
                    spy.wait(timeout=60)
                row = summarise(label, engine, f"closed c={concurrency}", samples, window, idle=idle_window)
                rows.append(row)
                print(f"[{label}] {engine} c={concurrency}: {row['headline']}", file=sys.stderr, flush=True)
            if engine == "sim" and args.replay_rates:
                trace = azure_rows(int(max(args.replay_rates) * args.replay_s) + 10)

                def trace_prompt(i: int, trace: list[tuple[int, int]] = trace) -> tuple[str, int]:
                    context_tokens, generated_tokens = trace[i]  # ~ContextTokens in, GeneratedTokens out
                    return f"r{i} " + "word " * context_tokens, generated_tokens

                for rate in args.replay_rates:
                    make = request_maker(stack.model, f"{label}-replay{rate}", trace_prompt)
                    rows.append(await replay_window(label, stack, client, make, rate, args.replay_s, cpu, idle_window))
            if engine == "sim" and args.stream_concurrency:
                for concurrency in args.stream_concurrency:
                    tag = f"{label}-stream-c{concurrency}"
                    make = request_maker(stack.model, tag, stream_prompt(tag, args.stream_tokens))
                    row = await stream_window(
                        label,
                        client,
                        make,
                        concurrency,
                        args.stream_tokens,
                        args.warmup_s,
                        args.stream_s,
                        cpu,
                        idle_window,
                    )
                    rows.append(row)
                    print(f"[{label}] {engine} {row['load']}: {row['headline']}", file=sys.stderr, flush=True)
            duplicates = sum(1 for n in client.finals.values() if n > 1)
            rows.append({"tree": label, "engine": engine, "load": "check", "double_finals": duplicates})
        finally:
            await client.stop()
            await stack.stop()
    return rows


async def amain(args: argparse.Namespace) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="llmbus-pipeline-bench-") as tmp:
        work = Path(tmp)
        if args.baseline:
            rows += await run_tree("before", export_tree(args.baseline, work), args, work)
        rows += await run_tree("after", REPO, args, work)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short windows (smoke run)")
    parser.add_argument("--baseline", help="a git revision to measure first, side by side (e.g. main)")
    parser.add_argument("--engines", default="openai,sim")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=4.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--replay-rates", default="25,100")
    parser.add_argument("--replay-s", type=float, default=15.0)
    parser.add_argument(
        "--stream-concurrency", default="16,64", help="closed-loop streaming clients (sim), '' for none"
    )
    parser.add_argument("--stream-tokens", type=int, default=512, help="tokens per streamed answer")
    parser.add_argument("--stream-s", type=float, default=15.0, help="streaming window")
    parser.add_argument("--direct-requests", type=int, default=100)
    parser.add_argument("--profile", help="a directory: py-spy collapsed stacks of each service (not committed)")
    parser.add_argument("--profile-concurrency", type=int, default=16)
    parser.add_argument("--out", default=str(REPO / "bench" / "reports" / "pipeline"))
    args = parser.parse_args(argv)
    if args.quick:
        args.window_s, args.warmup_s, args.replay_s, args.direct_requests, args.idle_s = 10.0, 3.0, 6.0, 30, 5.0
        args.stream_s = 8.0
    args.engines = [e for e in args.engines.split(",") if e]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.replay_rates = [float(r) for r in args.replay_rates.split(",") if r]
    args.stream_concurrency = [int(c) for c in args.stream_concurrency.split(",") if c]
    command = "python -m bench.pipeline_bench " + shlex.join(argv if argv is not None else sys.argv[1:])
    # SIGTERM (a `timeout`, a CI cancel) unwinds like Ctrl-C: the stacks' services are stopped, not orphaned.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    rows = asyncio.run(amain(args))
    write_reports(rows, Path(args.out), command.strip(), vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
