"""The tiny model eager, then as the worker starts it on a GPU (CUDA graphs captured): cold-start phases and decode.

    python -m bench.gpu_graphs --out /tmp/graphs.json      # a step of `make gpu-check` (bench/gpu_check.py)

Each engine is built like the worker's (VllmEngine), warmed up with the worker's plan (5 dummy prompts as long
as the window allows), then decodes 16 concurrent greedy requests of 128 tokens. The window and batch are the
worker bench's (bench/worker_vllm_bench.py), so the compiled graphs vLLM caches here serve that step too.
Writes {"eager": {...}, "cuda_graphs": {...}} to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

DECODE_REQUESTS, DECODE_TOKENS = 16, 128
GPU_MEMORY_UTILIZATION = 0.3


async def engine_run(enforce_eager: bool | None) -> dict[str, Any]:
    from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
    from llmbus_services.engine_worker.core.engine import EngineRequest
    from llmbus_tools.harness.vllm_config import TINY_MAX_MODEL_LEN, tiny_vllm_config

    config = tiny_vllm_config(
        enforce_eager=enforce_eager,
        max_model_len=TINY_MAX_MODEL_LEN,
        max_num_seqs=DECODE_REQUESTS,
        warmup_iterations=5,
        warmup_prompt_tokens=1024,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        engine_core_start_method=None,  # vLLM's own choice on a GPU, as the worker makes it
    )
    engine = VllmEngine(config)
    await engine.start()
    await engine.warmup()
    try:

        async def one(i: int) -> int:
            request = EngineRequest(f"decode-{i}", f"the kafka broker {i}", DECODE_TOKENS, temperature=0.0)
            last = 0
            async for out in engine.generate(request):
                last = out.completion_tokens
            return last

        started = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i) for i in range(DECODE_REQUESTS))))
        wall_s = time.perf_counter() - started
    finally:
        await engine.stop()
    return {
        "enforce_eager": engine.enforce_eager(),
        "cold_start_s": round(engine.cold_start_s or 0.0, 3),
        "cold_start_phases_s": engine.cold_start_phases_s,
        "decode_tokens": tokens,
        "decode_tokens_per_s": round(tokens / wall_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where the JSON goes")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    runs = {"eager": asyncio.run(engine_run(True)), "cuda_graphs": asyncio.run(engine_run(None))}
    args.out.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
