"""SimCore makes the same scheduling decisions as vLLM's own v1 Scheduler (needs the vLLM CPU build)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from bench.sim_vllm_parity import make_workload, run_parity
from services.engine_worker.engines.sim.profiles import get_profile

pytestmark = pytest.mark.vllm


def test_every_step_matches_vllm_under_kv_pressure_and_prefix_sharing() -> None:
    workload = make_workload("tight", seed=5, n=30, kv_blocks=50, max_num_seqs=8, budget=256)
    result = run_parity(workload, get_profile("llama-3.1-8b-h100"))
    assert result.vllm_preemptions > 0  # the workload really exercises preemption
    assert result.first_mismatches == []
    assert result.identical_steps == result.steps
    assert result.sim_preemptions == result.vllm_preemptions
