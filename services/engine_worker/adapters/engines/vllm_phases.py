"""Where the start of vLLM's engine core goes: weights, the KV pool, kernels, timed inside vLLM's own workers.

vLLM builds the model in the engine-core process (and, with tensor or pipeline parallelism, in one worker
process per GPU), out of reach of a timer in the worker's process; it only logs its timings there
("Model loading took", "init engine (profile, create kv cache, warmup model) took"). So the worker sets
vLLM's own `worker_cls` engine argument (`--worker-cls`) to a subclass of the platform's worker class that
times the methods vLLM's engine core calls, in this order, while it starts:

- `weights`: `load_model`, the checkpoint read and the weights placed on the device;
- `kv_pool`: `determine_available_memory` (the memory profile: a dummy forward pass of a full batch), then
  `initialize_from_config` (the KV cache allocated);
- `kernels`: `compile_or_warm_up_model`, torch.compile and CUDA graph capture on a GPU; little on the CPU
  build, which warms its kernels up during the memory profile.

The subclass answers `AsyncLLM.collective_rpc(RPC_METHOD)` with its phases, one dict per rank; the slowest
rank's time counts for each phase (the engine core waits for all of them). What the engine core's start
took besides these (the process started, the device and the distributed group set up, the scheduler
built) is `engine_process`. The subclass is named by a string (`TimedGpuWorker`, `TimedCpuWorker`) and
built on first lookup, in whichever process vLLM resolves it: importing this module imports no vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

RPC_METHOD = "llmbus_start_phases_s"
WORKER_PHASES = ("weights", "kv_pool", "kernels")
REST_PHASE = "engine_process"
_PHASE_OF_METHOD = {
    "load_model": "weights",
    "determine_available_memory": "kv_pool",
    "initialize_from_config": "kv_pool",
    "compile_or_warm_up_model": "kernels",
}
# What vLLM's platforms resolve `worker_cls="auto"` to, and the timed subclass of each (this module's names).
_TIMED_NAMES = {
    "vllm.v1.worker.gpu_worker.Worker": "TimedGpuWorker",  # CUDA and ROCm
    "vllm.v1.worker.cpu_worker.CPUWorker": "TimedCpuWorker",
}


def timed_worker_cls(worker_cls: str) -> str | None:
    """The qualified name of the timed subclass of vLLM's `worker_cls`; None for a worker class not known here
    (XPU, TPU, a custom one): its start is then one `engine_process` phase."""
    name = _TIMED_NAMES.get(worker_cls)
    return f"{__name__}.{name}" if name else None


def engine_core_phases(total_s: float, per_rank: Sequence[dict[str, float]]) -> dict[str, float]:
    """The engine core's start split: `engine_process` (the rest), then the workers' phases (slowest rank each)."""
    slowest = {p: max((rank.get(p, 0.0) for rank in per_rank), default=0.0) for p in WORKER_PHASES}
    timed = {p: round(s, 3) for p, s in slowest.items() if any(p in rank for rank in per_rank)}
    return {REST_PHASE: round(max(0.0, total_s - sum(timed.values())), 3), **timed}


def _timed_subclass(base: type) -> type:
    def timed(method: str) -> Callable[..., Any]:
        phase = _PHASE_OF_METHOD[method]

        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return getattr(super(cls, self), method)(*args, **kwargs)
            finally:
                phases = self.__dict__.setdefault("_llmbus_phases_s", {})
                phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - started

        run.__name__ = method
        return run

    def start_phases(self: Any) -> dict[str, float]:
        return dict(self.__dict__.get("_llmbus_phases_s", {}))

    namespace: dict[str, Any] = {method: timed(method) for method in _PHASE_OF_METHOD}
    namespace[RPC_METHOD] = start_phases
    namespace["__module__"] = __name__
    cls = type(f"Timed{base.__name__}", (base,), namespace)
    return cls


def __getattr__(name: str) -> type:
    """Build a timed worker class when vLLM resolves its name (PEP 562: only then is vLLM imported)."""
    if name == "TimedGpuWorker":
        from vllm.v1.worker.gpu_worker import Worker

        base: type = Worker
    elif name == "TimedCpuWorker":
        from vllm.v1.worker.cpu_worker import CPUWorker

        base = CPUWorker
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    built = _timed_subclass(base)
    built.__qualname__ = name
    globals()[name] = built
    return built
