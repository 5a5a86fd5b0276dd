"""Make a request trace from ServeGen's published per-client workload data (alibaba/ServeGen, Apache-2.0).

    python -m bench.servegen_trace --servegen <checkout of github.com/alibaba/ServeGen> \
        [--category reason --model deepseek-r1] [--clients 35] [--busiest | --start-s S] [--hours 1] [--seed 1]

ServeGen characterises a day of Alibaba Cloud Model Studio traffic per client: for every 10-minute
window its request rate, the coefficient of variation of its inter-arrival times and the fitted
distribution (Gamma or Weibull: shape, scale); for every 6 hours the distribution of its prompt and
output lengths. This draws, for each client and window, that many inter-arrival times from the
client's distribution (scaled, as ServeGen does, so the window holds rate x 600 s requests) and each
request's lengths from the client's distributions, merges the clients and writes the hour as
`timestamp_s,prompt_tokens,output_tokens` (data/traces/servegen-<model>.csv by default). The draw
is seeded, so the same checkout and arguments give the same file.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import math
import sys
from pathlib import Path

import numpy as np

from bench.traces import TRACES_DIR

WINDOW_S = 600


def _pdf(text: str) -> tuple[np.ndarray, np.ndarray] | None:
    """A ServeGen length distribution ('{tokens: probability, ...}') as (values, cumulative probabilities)."""
    pdf = ast.literal_eval(text)
    if not pdf:
        return None
    values = np.array(sorted(pdf))
    cdf = np.cumsum([pdf[v] for v in values])
    return values, cdf / cdf[-1]


def _client(folder: Path, client: int) -> tuple[list[list[str]], dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]]:
    rows = [line.strip().split(",") for line in (folder / f"chunk-{client}-trace.csv").read_text().splitlines()]
    lengths = {}
    for start, fields in json.loads((folder / f"chunk-{client}-dataset.json").read_text()).items():
        prompt, output = _pdf(fields["input_tokens"]), _pdf(fields["output_tokens"])
        if prompt is not None and output is not None:
            lengths[int(start)] = {"prompt": prompt, "output": output}
    return rows, lengths


def _draw(dist: tuple[np.ndarray, np.ndarray], n: int, rng: np.random.Generator) -> np.ndarray:
    values, cdf = dist
    return values[np.minimum(np.searchsorted(cdf, rng.random(n)), len(values) - 1)]


def clients_of(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("chunk-*-trace.csv"))


def generate(folder: Path, clients: list[int], start_s: int, hours: float, seed: int) -> list[tuple[float, int, int]]:
    rng = np.random.default_rng(seed)
    end_s = start_s + hours * 3600
    requests: list[tuple[float, int, int]] = []
    for client in clients:
        rows, lengths = _client(folder, client)
        for stamp, rate, _cv, pattern, shape, scale in rows:
            t0 = int(stamp)
            if not pattern or not start_s <= t0 < end_s or float(rate) <= 0:
                continue
            block = max((b for b in lengths if b <= t0), default=None)
            if block is None:
                continue  # no lengths for this client yet
            n = math.ceil(float(rate) * WINDOW_S)
            k, theta = float(shape), float(scale)
            gaps = rng.gamma(k, theta, n) if pattern == "Gamma" else rng.weibull(k, n) * theta
            gaps *= WINDOW_S / gaps.sum()
            times = t0 - start_s + np.cumsum(gaps) - gaps[0] * rng.random()
            prompts, outputs = _draw(lengths[block]["prompt"], n, rng), _draw(lengths[block]["output"], n, rng)
            requests += zip(times.tolist(), prompts.tolist(), outputs.tolist(), strict=True)
    requests.sort()
    return [(t, max(1, int(p)), max(1, int(o))) for t, p, o in requests if 0 <= t < hours * 3600]


def busiest_start(folder: Path, clients: list[int], hours: float) -> int:
    total: dict[int, float] = {}
    for client in clients:
        for line in (folder / f"chunk-{client}-trace.csv").read_text().splitlines():
            stamp, rate = line.split(",")[:2]
            total[int(stamp)] = total.get(int(stamp), 0.0) + float(rate)
    span = int(hours * 3600 // WINDOW_S)
    starts = sorted(total)
    return max(starts, key=lambda s: sum(total.get(s + i * WINDOW_S, 0.0) for i in range(span)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servegen", required=True, type=Path, help="a checkout of github.com/alibaba/ServeGen")
    ap.add_argument("--category", default="reason")
    ap.add_argument("--model", default="deepseek-r1")
    ap.add_argument("--start-s", type=int, default=0, help="window start in ServeGen's time; 0 with --busiest")
    ap.add_argument("--busiest", action="store_true", help="start at the busiest stretch of --hours")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--clients", default="", help="comma-separated client ids ('': every client)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    folder = args.servegen / "data" / args.category / args.model
    clients = [int(c) for c in args.clients.split(",") if c] or clients_of(folder)
    start_s = busiest_start(folder, clients, args.hours) if args.busiest else args.start_s
    requests = generate(folder, clients, start_s, args.hours, args.seed)
    out = args.out or TRACES_DIR / f"servegen-{args.model}.csv"
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["timestamp_s", "prompt_tokens", "output_tokens"])
        writer.writerows((f"{t:.3f}", p, o) for t, p, o in requests)
    prompts = np.array([p for _, p, _ in requests])
    outputs = np.array([o for _, _, o in requests])
    print(
        f"{out}: {len(requests)} requests from {start_s} s for {args.hours} h; prompt mean {prompts.mean():.0f}, "
        f"output mean {outputs.mean():.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
