"""`llmbus status` in an 80-column terminal: every value whole, no line wider than the terminal."""

from __future__ import annotations

import io

from rich.console import Console

from llmbus.cli.fleet_view import cold_start_table, fleet_table, heard_recently, state_reasons
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


def test_a_failed_start_shows_its_reason_and_a_start_its_phases() -> None:
    failed = WorkerStatus(
        worker_id="w-bad",
        node_id="n",
        state=WorkerState.FAILED,
        state_reason="artifact_digest_mismatch: model.safetensors: sha256 9f2c, the artifact lists 0b7a",
        engine="vllm",
        models=["tiny"],
    )
    ready = failed.model_copy(
        update={
            "worker_id": "w-good",
            "state": WorkerState.READY,
            "state_reason": None,
            "cold_start_s": 29.1,
            "cold_start_phases_s": {"startup": 0.6, "fetch": 4.2, "verify": 1.3, "engine_process": 14.0, "warmup": 0.2},
        }
    )
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)
    console.print(fleet_table([failed, ready]))
    phases = cold_start_table([failed, ready])
    assert phases is not None
    console.print(phases)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    words = text.split()
    assert words[words.index("w-bad") + 1 :][:1] == ["failed"]  # the state in its cell
    # the reason whole on a line of its own under the table (as `llmbus status` prints it), not folded in a cell
    assert state_reasons([failed, ready]) == [
        "w-bad  failed: artifact_digest_mismatch: model.safetensors: sha256 9f2c, the artifact lists 0b7a"
    ]
    assert "fetch 4.20  verify 1.30" in text
    assert cold_start_table([failed]) is None  # no worker started: no table


def test_workers_not_heard_from_for_ten_minutes_are_left_out() -> None:
    now = 1_800_000_000_000
    live = WorkerStatus(
        worker_id="w-live", node_id="n", state=WorkerState.READY, engine="sim", models=["m"], sent_at_ms=now - 2_000
    )
    gone = live.model_copy(update={"worker_id": "w-gone", "state": WorkerState.FAILED, "sent_at_ms": now - 601_000})
    edge = live.model_copy(update={"worker_id": "w-edge", "sent_at_ms": now - 600_000})
    recent, left_out = heard_recently([live, gone, edge], now)
    assert [s.worker_id for s in recent] == ["w-live", "w-edge"]
    assert left_out == 1
