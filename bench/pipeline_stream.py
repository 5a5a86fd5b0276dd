"""Token streaming through the bus: long answers from the sim at zero time, closed loop.

Each client asks for `max_tokens` (the sim answers exactly that many: it stops on length) and
sends its next request when the final chunk is in. Over the window, the client's reply-topic
reader counts every chunk and its tokens (aggregate tokens/s delivered to the client) and each
chunk's delivery time: the client's receive time minus the record's Kafka CreateTime, which the
worker's producer stamps when it sends the chunk (both this machine's wall clock). The worker
batches tokens into chunks (every `chunk_interval_ms` or `chunk_max_tokens`, its defaults here).
"""

from __future__ import annotations

import math

from bench.pipeline_load import ChunkMeter, CpuWindow, MakeRequest, PipelineClient, closed_loop
from bench.pipeline_queued import percentiles
from bench.pipeline_report import CONTROL_PLANE, summarise

TOKENS_PER_S_TARGET = 100_000
CHUNK_P99_TARGET_MS = 50.0
CREATE_TIME = 0  # Kafka's timestamp type of a record stamped by its producer (1: the broker's append time)


def summarise_stream(meter: ChunkMeter, elapsed_s: float, cpu_s: dict[str, float]) -> dict[str, object]:
    """Tokens and chunks per second delivered, chunk delivery percentiles, CPU per 1,000 tokens, the targets."""
    elapsed_s = elapsed_s or 1.0
    tokens_per_s = round(meter.tokens / elapsed_s, 1)
    delivery = percentiles(meter.delivery_ms)
    thousands = max(1, meter.tokens) / 1000
    cpu_ms_per_1k_tokens = {name: round(1000 * s / thousands, 2) for name, s in cpu_s.items() if not math.isnan(s)}
    control_ms = round(sum(cpu_ms_per_1k_tokens.get(name, 0.0) for name in CONTROL_PLANE), 2)
    p99 = delivery["p99"]
    throughput_verdict = (
        "met" if tokens_per_s >= TOKENS_PER_S_TARGET else f"missed: {tokens_per_s / TOKENS_PER_S_TARGET:.1%} of it"
    )
    if p99 is None:
        delivery_verdict = "no chunks"
    elif p99 <= CHUNK_P99_TARGET_MS:
        delivery_verdict = "met"
    else:
        delivery_verdict = f"missed by {p99 - CHUNK_P99_TARGET_MS:.1f} ms"
    return {
        "tokens": meter.tokens,
        "chunks": meter.chunks,
        "tokens_per_s": tokens_per_s,
        "chunks_per_s": round(meter.chunks / elapsed_s, 1),
        "tokens_per_chunk": round(meter.tokens / meter.chunks, 1) if meter.chunks else None,
        "chunk_delivery_ms": delivery,
        "timestamps": "CreateTime" if meter.timestamp_types == {CREATE_TIME} else sorted(meter.timestamp_types),
        "cpu_ms_per_1k_tokens": cpu_ms_per_1k_tokens,
        "control_plane_cpu_ms_per_1k_tokens": control_ms,
        "target": f"≥ {TOKENS_PER_S_TARGET:,} tokens/s with chunk delivery p99 ≤ {CHUNK_P99_TARGET_MS:g} ms",
        "verdict": {"tokens_per_s": throughput_verdict, "chunk_delivery_p99": delivery_verdict},
    }


async def stream_window(
    label: str,
    client: PipelineClient,
    make_request: MakeRequest,
    concurrency: int,
    answer_tokens: int,
    warmup_s: float,
    window_s: float,
    cpu: CpuWindow,
    idle: dict[str, object],
) -> dict[str, object]:
    """One closed-loop streaming window on the sim stack: the pipeline row plus `stream`."""
    meter = ChunkMeter()
    client.meter = meter
    try:
        samples, window = await closed_loop(
            client, make_request, concurrency, warmup_s, window_s, cpu, timeout_s=60.0, meter=meter
        )
    finally:
        client.meter = None
    load = f"stream c={concurrency}, {answer_tokens} tokens"
    row = summarise(label, "sim", load, samples, window, idle=idle)
    cpu_s: dict[str, float] = window.get("cpu_s", {})  # type: ignore[assignment]
    row["stream"] = summarise_stream(meter, float(window.get("elapsed_s", 0.0)), cpu_s)  # type: ignore[arg-type]
    stream: dict[str, object] = row["stream"]  # type: ignore[assignment]
    row["headline"] = (
        f"{stream['tokens_per_s']:,} tokens/s ({stream['tokens_per_chunk']} per chunk), chunk delivery "
        f"{stream['chunk_delivery_ms']}, {row['requests_per_s']} req/s, errors {row['errors'] or 0}"
    )
    return row
