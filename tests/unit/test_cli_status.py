"""`llmbus status` in an 80-column terminal: every value whole, no line wider than the terminal."""

from __future__ import annotations

import io

from rich.console import Console

from llmbus.cli.fleet_view import fleet_table
from llmbus.contract.messages import WorkerState, WorkerStatus


def test_status_table_fits_80_columns_without_cutting_values() -> None:
    fleet = [
        WorkerStatus(
            worker_id=f"gpu-node-17-worker-{i}",
            node_id="n",
            state=WorkerState.DRAINING,
            engine="vllm",
            models=["llama-3.3-70b-instruct"],
            num_requests_running=128,
            num_requests_waiting=1024,
            kv_cache_usage_perc=0.93,
            prefix_cache_hit_rate=0.41,
            generation_tokens_per_s=12345.0,
            cold_start_s=312.5,
        )
        for i in range(3)
    ]
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(fleet_table(fleet))
    text = out.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for value in ("1024", "93%", "41%", "12345", "312.5", "draining"):
        assert value in text
    # Long names wrap inside their cell (folded), whole: the pieces sit on consecutive lines.
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if "gpu-node-17" in line)
    model_col = lines[row].index("llama")
    model = lines[row][model_col:].split()[0] + lines[row + 1][model_col:].split()[0]
    assert model == "llama-3.3-70b-instruct"
