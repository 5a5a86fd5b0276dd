"""SimCore makes the same scheduling decisions as vLLM's own v1 Scheduler (needs the vLLM CPU build)."""

from __future__ import annotations

from importlib.util import find_spec

import pytest

from bench.sim_vllm_parity import make_workload, run_parity
from llmbus_services.engine_worker.adapters.engines.sim.profiles import get_profile

# find_spec, not importorskip: importing vllm (and torch) at collection costs every pytest-xdist worker ~5 s.
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(find_spec("vllm") is None, reason="needs the vLLM CPU build")]


def test_every_step_matches_vllm_under_kv_pressure_and_prefix_sharing() -> None:
    workload = make_workload("tight", seed=5, n=30, kv_blocks=50, max_num_seqs=8, budget=256)
    result = run_parity(workload, get_profile("llama-3.1-8b-h100"))
    assert result.vllm_preemptions > 0  # the workload really exercises preemption
    assert result.first_mismatches == []
    assert result.identical_steps == result.steps
    assert result.sim_preemptions == result.vllm_preemptions
