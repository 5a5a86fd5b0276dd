"""The autoscaler benchmark's traces and the tidal day each is warped onto.

Each public trace (data/traces/, sources and licences in its README) is about an hour of real
arrivals with their prompt and output lengths. Its first half makes the tuning day and its
second half the judged day, so nothing the judged day holds — its bursts, its lengths — is seen
while tuning. A half is time-warped onto a working day whose rate follows `DAY_SHAPE` (a quiet
night, a daytime base, 4x peaks 10-12 h and 14-17 h): its k-th arrival lands where the day's
expected count equals the trace's own (rate-normalised) count at that arrival, so the trace's
bursts stay bursts at the day's rate, and the half repeats as often as the day needs.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from bench.autoscaler_replay import Arrival
from bench.traces import TRACES_DIR

DAY_S = 86_400
# (hour, rate relative to the daytime base): linear between the points.
DAY_SHAPE = [
    (0, 0.2), (6, 0.2), (8, 1.0), (9.75, 1.0), (10, 4.0), (12, 4.0), (12.25, 1.0), (13.75, 1.0),
    (14, 4.0), (17, 4.0), (17.5, 1.0), (19, 0.6), (22, 0.2), (24, 0.2),
]  # fmt: skip


@dataclass(frozen=True)
class TraceSpec:
    name: str
    file: str
    shape: str  # what sets it apart, for the report
    base_rate_per_s: float  # the day's daytime base (peaks are 4x): sized so the peak needs a handful of workers
    max_output_tokens: int = 8192

    @property
    def path(self) -> Path:
        return TRACES_DIR / self.file


TRACES = {
    spec.name: spec
    for spec in (
        TraceSpec(
            "conversation",
            "azure-llm-2023-conv.csv",
            "Azure LLM 2023 conversation: ~1,150 prompt / ~210 output tokens, mildly bursty",
            base_rate_per_s=4.0,
        ),
        TraceSpec(
            "code",
            "azure-llm-2023-code.csv",
            "Azure LLM 2023 code: ~2,050 prompt / ~28 output tokens (prefill-heavy), very bursty",
            base_rate_per_s=2.0,
        ),
        TraceSpec(
            "reasoning",
            "servegen-deepseek-r1.csv",
            "ServeGen DeepSeek-R1: ~680 prompt / ~820 output tokens with a long tail (decode-heavy)",
            base_rate_per_s=3.0,
        ),
    )
}


@dataclass(frozen=True)
class Trace:
    offsets_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def half(self, which: int) -> Trace:
        """The first (0) or second (1) half, by arrival order, its offsets from its own start."""
        n = len(self.offsets_s) // 2
        cut = slice(0, n) if which == 0 else slice(n, None)
        offsets = self.offsets_s[cut]
        return Trace(offsets - offsets[0], self.prompt_tokens[cut], self.output_tokens[cut])

    def rolled(self, rows: int) -> Trace:
        """The same arrivals started `rows` in and wrapped around (another alignment with the day)."""
        span = self.offsets_s[-1] + float(np.mean(np.diff(self.offsets_s)))
        offsets = np.concatenate([self.offsets_s[rows:], self.offsets_s[:rows] + span]) - self.offsets_s[rows]
        return Trace(offsets, np.roll(self.prompt_tokens, -rows), np.roll(self.output_tokens, -rows))


def load(spec: TraceSpec) -> Trace:
    """Arrival offsets (s) and prompt / output tokens, in arrival order: Azure's CSV columns
    (TIMESTAMP, ContextTokens, GeneratedTokens) or bench/servegen_trace.py's (timestamp_s, ...)."""
    stamps, prompts, outputs = [], [], []
    with spec.path.open(newline="") as f:
        for row in csv.DictReader(f):
            if "TIMESTAMP" in row:
                stamps.append(datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp())
                prompt, output = row["ContextTokens"], row["GeneratedTokens"]
            else:
                stamps.append(float(row["timestamp_s"]))
                prompt, output = row["prompt_tokens"], row["output_tokens"]
            prompts.append(max(1, int(prompt)))
            outputs.append(max(1, int(output)))
    order = np.argsort(stamps, kind="stable")
    offsets = np.array(stamps)[order]
    return Trace(offsets - offsets[0], np.array(prompts)[order], np.array(outputs)[order])


def day_rate_per_s(t_s: np.ndarray, base_rate_per_s: float) -> np.ndarray:
    hours, shape = zip(*DAY_SHAPE, strict=True)
    return base_rate_per_s * np.interp((t_s % DAY_S) / 3600, hours, shape)


def tidal_day(trace: Trace, base_rate_per_s: float, max_output_tokens: int) -> list[Arrival]:
    """`trace` warped onto the day (repeated as often as it takes)."""
    offsets = trace.offsets_s
    span_s = offsets[-1] + float(np.mean(np.diff(offsets)))
    per_unit = len(offsets) / span_s  # trace arrivals per second: one expected arrival = 1/per_unit s
    grid = np.arange(0, DAY_S + 1, 1.0)
    expected = np.concatenate([[0.0], np.cumsum(day_rate_per_s(grid[:-1], base_rate_per_s))])
    total = expected[-1]
    outputs = np.minimum(trace.output_tokens, max_output_tokens)
    times, prompts, outs = [], [], []
    copy = 0
    while True:
        units = (offsets + copy * span_s) * per_unit
        keep = units < total
        if not keep.any():
            break
        times.append(np.interp(units[keep], expected, grid))
        prompts.append(trace.prompt_tokens[keep])
        outs.append(outputs[keep])
        copy += 1
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")
    at_ms, p, o = t[order] * 1000, np.concatenate(prompts)[order], np.concatenate(outs)[order]
    return [Arrival(float(a), int(n), int(m)) for a, n, m in zip(at_ms, p, o, strict=True)]


def days(spec: TraceSpec) -> dict[str, tuple[list[Arrival], list[Arrival]]]:
    """{"tune": (the tuning day, the day before it), "judge": (the judged day, the day before it)}.

    The tuning day is the trace's first half, its day before the same half in another alignment;
    the judged day is the second half, and the day before it is the tuning day (what the predictive
    policy's daily pattern has seen)."""
    trace = load(spec)
    first, second = trace.half(0), trace.half(1)
    tune = tidal_day(first, spec.base_rate_per_s, spec.max_output_tokens)
    before_tune = tidal_day(first.rolled(len(first.offsets_s) // 2), spec.base_rate_per_s, spec.max_output_tokens)
    judge = tidal_day(second, spec.base_rate_per_s, spec.max_output_tokens)
    return {"tune": (tune, before_tune), "judge": (judge, tune)}
