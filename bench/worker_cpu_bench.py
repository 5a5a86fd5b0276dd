"""CPU per request of the engine-worker's own code, in process: no broker, no Redis, no other service.

    python -m bench.worker_cpu_bench                          # this tree → bench/reports/worker_cpu_bench.*
    python -m bench.worker_cpu_bench --compare ../other-tree  # side by side → bench/reports/worker_cpu_compare.*

`handlers`: requests go through WorkerHandlers.on_dispatch (as the ConsumerLoop calls it, in the
record's trace context, tracing off as in the benchmarks) with the real SimEngine at zero time and
the real Publisher over a stand-in producer that acknowledges every record on the next loop turn,
all of a turn's records at once (as one produce response does). The fence is in memory. Closed loop:
`--concurrency` requests in flight. `engine`: the same requests through SimEngine.generate alone.

CPU time is time.process_time() around the timed requests (after a warm-up), so what the machine's
other processes do does not count; each tree runs in its own subprocess, the trees alternate, and
the median of `--rounds` is reported, with the Kafka records produced per request (a slower
worker makes more token chunks: the 20 ms chunk interval elapses more often within a request).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from llmbus.process.launch import checkout_pythonpath

REPORTS = Path(__file__).parent / "reports"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# ---- the child: one tree, one mode, one measurement ---------------------------------


class AckingProducer:
    """Stands in for AIOKafkaProducer: a send is enqueued at once and acknowledged on the next loop
    turn together with every other record of that turn (one produce response)."""

    def __init__(self) -> None:
        self.records = 0
        self._pending: list[asyncio.Future[object]] = []

    async def send(self, topic: str, value: bytes, **_: object) -> asyncio.Future[object]:
        loop = asyncio.get_running_loop()
        delivery: asyncio.Future[object] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._ack)
        self._pending.append(delivery)
        self.records += 1
        return delivery

    def _ack(self) -> None:
        pending, self._pending = self._pending, []
        for delivery in pending:
            if not delivery.done():
                delivery.set_result(None)

    async def stop(self) -> None:
        return None


class MemoryFence:
    """llmbus.state.fencing.RequestFence's rules on a dict (Redis is not what is measured here); each call
    takes one loop turn, as a round trip takes at least one (and the stand-in's acks come meanwhile)."""

    claim_lease_ms = 30_000

    def __init__(self) -> None:
        self.final: dict[str, str] = {}

    async def superseded(self, request_id: str, attempt: int) -> bool:
        await asyncio.sleep(0)
        return request_id in self.final and self.final[request_id] != f"pending:{attempt}"

    async def claim_final(self, request_id: str, attempt: int) -> bool:
        if await self.superseded(request_id, attempt):
            return False
        self.final[request_id] = f"pending:{attempt}"
        return True

    async def final_published(self, request_id: str, attempt: int) -> None:
        await asyncio.sleep(0)
        self.final[request_id] = f"done:{attempt}"


async def _closed_loop(count: int, concurrency: int, run_one) -> None:  # type: ignore[no-untyped-def]
    it = iter(range(count))

    async def client() -> None:
        for i in it:
            await run_one(i)

    await asyncio.gather(*(client() for _ in range(concurrency)))


async def measure(mode: str, requests: int, concurrency: int, max_tokens: int, warmup: int) -> dict[str, float]:
    from aiokafka.structs import ConsumerRecord
    from opentelemetry import context as otel_context

    from llmbus.bus.headers import trace_context
    from llmbus.bus.producer import Publisher
    from llmbus.contract.messages import Dispatch, InferenceRequest, RoutedRequest
    from llmbus.contract.topics import Topics
    from llmbus.observability.telemetry import setup_tracing
    from llmbus.settings import BusSettings
    from llmbus_services.engine_worker.adapters.engines.sim.engine import SimConfig, SimEngine
    from llmbus_services.engine_worker.config import WorkerSettings
    from llmbus_services.engine_worker.core.engine import EngineRequest
    from llmbus_services.engine_worker.flows import WorkerHandlers

    setup_tracing("engine-worker", BusSettings())
    engine = SimEngine(SimConfig(speedup=0))
    await engine.start()
    producer = AckingProducer()
    settings = BusSettings()

    class Bus:
        publisher = Publisher(producer, "engine-worker", settings.send_timeout_s)  # type: ignore[arg-type]
        topics = Topics("bench.")
        service = "engine-worker"

    Bus.settings = settings  # type: ignore[attr-defined]
    handlers = WorkerHandlers(
        Bus(),  # type: ignore[arg-type]
        WorkerSettings(worker_id="w1", engine="sim", sim_speedup=0),  # type: ignore[call-arg]
        engine,
        MemoryFence(),  # type: ignore[arg-type]
    )
    headers = [("traceparent", TRACEPARENT.encode())]

    def prompt(i: int) -> str:
        return f"bench request {i}: what does a control plane do?"

    async def through_handlers(i: int) -> None:
        request = InferenceRequest(prompt=prompt(i), model="sim-llama-8b", max_tokens=max_tokens, tenant="bench")
        raw = Dispatch(routed=RoutedRequest(request=request, model="sim-llama-8b"), worker_id="w1").to_bytes()
        record = ConsumerRecord("bench.llm.dispatch.w1", 0, i, 0, 0, None, raw, None, 0, len(raw), headers)
        token = otel_context.attach(trace_context(record.headers))
        try:
            await handlers.on_dispatch(record)
        finally:
            otel_context.detach(token)

    async def through_engine(i: int) -> None:
        async for _ in engine.generate(EngineRequest(f"r{i}", prompt(i), max_tokens)):
            pass

    run_one = through_handlers if mode == "handlers" else through_engine
    await _closed_loop(warmup, concurrency, run_one)
    records_before = producer.records
    started_cpu_s, started_wall_s = time.process_time(), time.perf_counter()
    await _closed_loop(requests, concurrency, lambda i: run_one(warmup + i))
    cpu_s, wall_s = time.process_time() - started_cpu_s, time.perf_counter() - started_wall_s
    await engine.stop()
    return {
        "cpu_ms_per_request": 1000 * cpu_s / requests,
        "wall_s": wall_s,
        "records_per_request": (producer.records - records_before) / requests,
    }


# ---- the parent: trees side by side ------------------------------------------------


def run_child(tree: Path, args: argparse.Namespace, mode: str) -> dict[str, float]:
    env = os.environ | {"PYTHONPATH": checkout_pythonpath(tree)}
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        mode,
        f"--requests={args.requests}",
        f"--concurrency={args.concurrency}",
        f"--max-tokens={args.max_tokens}",
        f"--warmup={args.warmup}",
    ]
    out = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", type=Path, help="another checkout (e.g. a `git worktree` of main) to run beside")
    parser.add_argument("--label", default="this tree", help="name of this checkout in the table")
    parser.add_argument("--compare-label", default="compared tree", help="name of the other one (no path in reports)")
    parser.add_argument("--modes", default="handlers,engine")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=["handlers", "engine"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = asyncio.run(measure(args.child, args.requests, args.concurrency, args.max_tokens, args.warmup))
        print(json.dumps(result))
        return

    here = Path(__file__).resolve().parent.parent
    trees = {args.label: here} | ({args.compare_label: args.compare.resolve()} if args.compare else {})
    runs: dict[str, dict[str, list[dict[str, float]]]] = {name: {} for name in trees}
    for mode in args.modes.split(","):
        for r in range(args.rounds):
            for name, tree in trees.items():
                result = run_child(tree, args, mode)
                runs[name].setdefault(mode, []).append(result)
                cpu_ms = result["cpu_ms_per_request"]
                print(f"[worker_cpu_bench] {mode} round {r + 1} {name}: {cpu_ms:.3f} ms", flush=True)
    summary = {
        name: {
            mode: {key: statistics.median(run[key] for run in results) for key in results[0]}
            for mode, results in by_mode.items()
        }
        for name, by_mode in runs.items()
    }
    lines = ["| tree | mode | CPU ms / request | Kafka records / request |", "|---|---|---|---|"]
    for name, by_mode in summary.items():
        for mode, m in by_mode.items():
            lines.append(f"| {name} | {mode} | {m['cpu_ms_per_request']:.3f} | {m['records_per_request']:.2f} |")
    if args.compare:
        for mode in summary[args.label]:
            this_ms = summary[args.label][mode]["cpu_ms_per_request"]
            ratio = summary[args.compare_label][mode]["cpu_ms_per_request"] / this_ms
            lines.append(f"\n{mode}: {args.compare_label} uses {ratio:.2f}x the CPU of {args.label}")
    table = "\n".join(lines)
    print(table)
    write_report(args, runs, summary, table)


def write_report(args: argparse.Namespace, runs: dict, summary: dict, table: str) -> None:  # type: ignore[type-arg]
    REPORTS.mkdir(exist_ok=True)
    name = "worker_cpu_compare" if args.compare else "worker_cpu_bench"
    # No machine paths in a committed report: the compared checkout is shown by its label.
    shown = [f"<{args.compare_label} checkout>" if args.compare and a == str(args.compare) else a for a in sys.argv[1:]]
    command = f"python -m bench.worker_cpu_bench {shlex.join(shown)}".strip()
    load = os.getloadavg()[0]
    document = {"command": command, "load_avg_1m": load, "args": vars(args) | {"compare": None}, "runs": runs}
    (REPORTS / f"{name}.json").write_text(json.dumps(document | {"median": summary}, indent=2, default=str))
    (REPORTS / f"{name}.md").write_text(
        f"# Engine-worker CPU per request, in process\n\n`{command}` (load average {load:.2f}; medians of "
        f"{args.rounds} rounds, {args.requests} requests each, concurrency {args.concurrency}, "
        f"{args.max_tokens} tokens out)\n\n{table}\n"
    )
    print(f"[worker_cpu_bench] wrote bench/reports/{name}.{{json,md}}", flush=True)


if __name__ == "__main__":
    main()
