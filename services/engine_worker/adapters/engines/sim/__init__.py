"""The `sim` engine: vLLM-like continuous batching, paged KV cache and prefix caching in virtual time."""

from llmbus_services.engine_worker.adapters.engines.sim.core import RequestOutput, SimCore, SimRequest, StepResult
from llmbus_services.engine_worker.adapters.engines.sim.engine import SimConfig, SimEngine
from llmbus_services.engine_worker.adapters.engines.sim.profiles import SimProfile, get_profile, load_profiles

__all__ = [
    "RequestOutput",
    "SimConfig",
    "SimCore",
    "SimEngine",
    "SimProfile",
    "SimRequest",
    "StepResult",
    "get_profile",
    "load_profiles",
]
