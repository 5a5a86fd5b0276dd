"""The engine core's start split into weights, KV pool and kernels (vllm_phases.py), and the cold-start record.

The timed worker is checked here on a stand-in worker class (no vLLM); against vLLM's real CPU build in
tests/integration/test_vllm_engine.py.
"""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmbus_services.engine_worker.adapters.cold_start_span import SPAN_NAME, record_cold_start
from llmbus_services.engine_worker.adapters.engines import vllm_phases
from llmbus_services.engine_worker.core.status import cold_start_phases
from llmbus_services.engine_worker.flows import RunSite


class StandInWorker:
    """The four methods vLLM's engine core calls on its worker while it starts, each taking a known time."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _take(self, name: str, seconds: float) -> str:
        self.calls.append(name)
        time.sleep(seconds)
        return name

    def load_model(self, *, load_dummy_weights: bool = False) -> str:
        return self._take("load_model", 0.03)

    def determine_available_memory(self) -> int:
        self._take("determine_available_memory", 0.02)
        return 123

    def initialize_from_config(self, kv_cache_config: object) -> str:
        return self._take("initialize_from_config", 0.01)

    def compile_or_warm_up_model(self) -> str:
        return self._take("compile_or_warm_up_model", 0.04)


def test_the_timed_worker_times_each_start_method_and_answers_the_rpc() -> None:
    timed = vllm_phases._timed_subclass(StandInWorker)
    worker = timed()
    assert isinstance(worker, StandInWorker) and getattr(worker, vllm_phases.RPC_METHOD)() == {}
    assert worker.load_model(load_dummy_weights=True) == "load_model"  # arguments and results pass through
    assert worker.determine_available_memory() == 123
    worker.initialize_from_config(object())
    worker.compile_or_warm_up_model()
    assert worker.calls == [
        "load_model",
        "determine_available_memory",
        "initialize_from_config",
        "compile_or_warm_up_model",
    ]
    phases = getattr(worker, vllm_phases.RPC_METHOD)()
    assert list(phases) == ["weights", "kv_pool", "kernels"]
    assert phases["weights"] == pytest.approx(0.03, abs=0.02)
    assert phases["kv_pool"] == pytest.approx(0.03, abs=0.02)  # the memory profile and the allocation
    assert phases["kernels"] == pytest.approx(0.04, abs=0.02)


def test_a_failing_start_method_still_raises() -> None:
    class Broken(StandInWorker):
        def load_model(self, *, load_dummy_weights: bool = False) -> str:
            raise MemoryError("CUDA out of memory")

    worker = vllm_phases._timed_subclass(Broken)()
    with pytest.raises(MemoryError):
        worker.load_model()
    assert "weights" in getattr(worker, vllm_phases.RPC_METHOD)()


def test_vllms_worker_classes_have_a_timed_subclass_and_others_do_not() -> None:
    assert vllm_phases.timed_worker_cls("vllm.v1.worker.gpu_worker.Worker") == f"{vllm_phases.__name__}.TimedGpuWorker"
    assert (
        vllm_phases.timed_worker_cls("vllm.v1.worker.cpu_worker.CPUWorker") == f"{vllm_phases.__name__}.TimedCpuWorker"
    )
    assert vllm_phases.timed_worker_cls("vllm.v1.worker.xpu_worker.XPUWorker") is None
    assert vllm_phases.timed_worker_cls("my_plugin.MyWorker") is None
    with pytest.raises(AttributeError):
        vllm_phases.TimedTpuWorker  # noqa: B018


def test_the_slowest_rank_counts_and_the_rest_is_the_engine_process() -> None:
    ranks = [{"weights": 10.0, "kv_pool": 3.0, "kernels": 20.0}, {"weights": 12.0, "kv_pool": 2.0, "kernels": 18.5}]
    assert vllm_phases.engine_core_phases(40.0, ranks) == {
        "engine_process": 5.0,  # 40 - (12 + 3 + 20)
        "weights": 12.0,
        "kv_pool": 3.0,
        "kernels": 20.0,
    }
    assert vllm_phases.engine_core_phases(7.5, []) == {"engine_process": 7.5}  # not timed: one phase
    assert vllm_phases.engine_core_phases(1.0, ranks)["engine_process"] == 0.0  # never negative


def test_the_workers_phases_keep_the_order_they_ran_in() -> None:
    engine = {
        "import": 8.0,
        "config": 1.0,
        "engine_process": 4.0,
        "weights": 30.0,
        "kv_pool": 6.0,
        "kernels": 25.0,
        "warmup": 3.0,
    }
    phases = cold_start_phases(2.0, 74.0, 3.5, engine)
    assert list(phases) == ["startup", "import", "config", "engine_process", "weights", "kv_pool", "kernels", "warmup"]
    assert phases["warmup"] == 3.5  # the worker's own measure of the warm-up plan
    assert cold_start_phases(2.0, 5.0, 1.0, {}) == {"startup": 2.0, "engine_start": 5.0, "warmup": 1.0}


def test_the_cold_start_span_spans_the_start_and_carries_each_phase() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    phases = {"startup": 1.5, "weights": 30.0, "kv_pool": 6.0, "kernels": 25.0, "warmup": 3.0}
    site = RunSite(node_id="gpu-node-1", gpu="NVIDIA H200", model_version="3", model_format="fp8")
    record_cold_start(1_700_000_000_000, 65.5, phases, "w1", "vllm", "llama-8b", site, provider.get_tracer("t"))

    [span] = exporter.get_finished_spans()
    assert span.name == SPAN_NAME
    assert span.start_time == 1_700_000_000_000 * 10**6 and span.end_time - span.start_time == 65_500_000_000
    attrs = dict(span.attributes or {})
    assert attrs["llmbus.cold_start_s"] == 65.5
    assert {k: v for k, v in attrs.items() if k.startswith("llmbus.cold_start.phase.")} == {
        f"llmbus.cold_start.phase.{name}_s": seconds for name, seconds in phases.items()
    }
    assert (
        attrs["llmbus.worker_id"] == "w1"
        and attrs["llmbus.gpu"] == "NVIDIA H200"
        and attrs["llmbus.model.format"] == "fp8"
    )
