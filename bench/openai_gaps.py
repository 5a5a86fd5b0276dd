"""How long an OpenAI-compatible upstream takes to its first token and between tokens: the figures an
openai-http upstream's `first_token_timeout_s` and `stall_timeout_s` are set from (OPENAI_HTTP.md).

    python -m bench.openai_gaps --fake                      # the test suite's fake upstream, in process
    python -m bench.openai_gaps --tiny-vllm                 # `vllm serve` of the tests' tiny model (CPU build)
    python -m bench.openai_gaps --base-url https://api.openai.com/v1 --model gpt-4.1-mini --api-key-env OPENAI_API_KEY

Streams `--requests` chat completions, `--concurrency` at a time, each of `--max-tokens` tokens, and times
every content event of each answer as it is read: the first token from the request's send, then each gap.
Writes bench/reports/openai_gaps_<label>.json and .md (quantiles, the worst, the command).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import shlex
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from llmbus_tools.harness.openai_server import FakeOpenAIServer
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.tiny_llama import build_tiny_llama

REPORTS = Path(__file__).resolve().parent / "reports"
QUANTILES = (0.5, 0.9, 0.99, 0.999)


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by the nearest rank (no interpolation: a value that was measured)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def one_answer(client: httpx.AsyncClient, model: str, max_tokens: int, n: int) -> tuple[float, list[float]]:
    """(seconds to the first token, the gaps between tokens) of one streamed chat completion."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Write about Kafka consumer groups ({n})."}],
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0.7,
        "ignore_eos": True,  # vLLM's: every answer max_tokens long (random weights end anywhere); others ignore it
    }
    sent = time.perf_counter()
    times: list[float] = []
    async with client.stream("POST", "/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                times.append(time.perf_counter())
    if not times:
        raise RuntimeError("an answer without tokens")
    return times[0] - sent, [b - a for a, b in itertools.pairwise(times)]


async def measure(base_url: str, model: str, headers: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    first: list[float] = []
    gaps: list[float] = []
    gate = asyncio.Semaphore(args.concurrency)
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=600, limits=limits) as client:

        async def run(n: int) -> None:
            async with gate:
                ttft_s, between_s = await one_answer(client, model, args.max_tokens, n)
                first.append(ttft_s)
                gaps.extend(between_s)

        started = time.perf_counter()
        await asyncio.gather(*(run(n) for n in range(args.requests)))
        wall_s = time.perf_counter() - started

    def summary(values: list[float]) -> dict[str, float]:
        return {f"p{q * 100:g}": round(quantile(values, q), 4) for q in QUANTILES} | {"max": round(max(values), 4)}

    return {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "wall_s": round(wall_s, 2),
        "first_token_s": summary(first),
        "gap_s": summary(gaps),
        "gaps_measured": len(gaps),
    }


@contextlib.asynccontextmanager
async def fake_upstream() -> AsyncIterator[tuple[str, str]]:
    server = FakeOpenAIServer()
    await server.start()
    try:
        yield server.base_url, "det"
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def tiny_vllm_serve(max_num_seqs: int) -> AsyncIterator[tuple[str, str]]:
    """`vllm serve` of the tiny random-weight Llama on this machine's CPU build, as a child process."""
    port = free_port()
    model_dir = build_tiny_llama()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    command += ["--served-model-name", "tiny", "--port", str(port), "--dtype", "float32", "--enforce-eager"]
    command += ["--max-model-len", "512", "--max-num-seqs", str(max_num_seqs)]
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(600):
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"{base_url}/models", timeout=2)).status_code == 200:
                        break
                if proc.returncode is not None:
                    raise RuntimeError(f"vllm serve exited with {proc.returncode}")
                await asyncio.sleep(1)
            else:
                raise TimeoutError("vllm serve did not answer in 600 s")
        yield base_url, "tiny"
    finally:
        proc.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 30)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def write(label: str, report: dict[str, Any]) -> Path:
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / f"openai_gaps_{label}.json").write_text(json.dumps(report, indent=2) + "\n")
    rows = [
        f"| {name} | "
        + " | ".join(f"{report[key][q]:.3f}" for q in (*[f"p{q * 100:g}" for q in QUANTILES], "max"))
        + " |"
        for name, key in (("first token", "first_token_s"), ("between tokens", "gap_s"))
    ]
    md = REPORTS / f"openai_gaps_{label}.md"
    md.write_text(
        f"# First token and gaps between tokens: {report['upstream']}\n\n"
        f"`{report['command']}`\n\n"
        f"{report['requests']} streamed chat completions of {report['max_tokens']} tokens, {report['concurrency']} at "
        f"a time, in {report['wall_s']} s; {report['gaps_measured']} gaps. Seconds:\n\n"
        "| | p50 | p90 | p99 | p99.9 | max |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    return md


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--fake", action="store_true")
    where.add_argument("--tiny-vllm", action="store_true")
    where.add_argument("--base-url")
    parser.add_argument("--model", default="")
    parser.add_argument("--api-key-env", default="")
    parser.add_argument("--label", default="")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {os.environ[args.api_key_env]}"} if args.api_key_env else {}
    if args.fake:
        label, upstream = args.label or "fake", fake_upstream()
    elif args.tiny_vllm:
        label, upstream = args.label or "tiny_vllm", tiny_vllm_serve(args.concurrency)
    else:
        label, upstream = args.label or "upstream", contextlib.nullcontext((args.base_url, args.model))  # type: ignore[assignment]
    async with upstream as (base_url, model):
        report = await measure(base_url, model, headers, args)
    report["upstream"] = {"fake": "the fake upstream", "tiny_vllm": "vllm serve, tiny model, CPU"}.get(label, base_url)
    report["command"] = "python -m bench.openai_gaps " + shlex.join(sys.argv[1:])
    print(write(label, report).read_text())


if __name__ == "__main__":
    asyncio.run(main())
