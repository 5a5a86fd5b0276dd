"""`python -m llmbus_services.engine_worker.adapters.node.profile` prints this node's profile (llmbus.node.probe)
and the format an example 8B model would run as here (the worker's format choice, core/node_plan.py).
"""

from __future__ import annotations

import os
from typing import Any

from llmbus.contract.messages.fleet import NodeProfile
from llmbus.node.probe import profile_node


def example_format_choice(profile: NodeProfile) -> tuple[str | None, str]:
    """The format Llama-3.1-8B-Instruct would run as on this node (this process's GPUs, the worker's TP
    settings from the environment), and why; (None, why not) without a GPU or when nothing fits."""
    from llmbus.contract.messages.fleet import ModelFormat, ModelSpec
    from llmbus_services.engine_worker.config import WorkerSettings
    from llmbus_services.engine_worker.core.formats import NoFormatFits
    from llmbus_services.engine_worker.core.node_plan import plan_for

    if not profile.gpus:
        return None, "no GPU: the CPU build runs float32/bf16 weights; no format choice is made"
    example = ModelSpec(
        name="llama-3.1-8b-instruct",
        max_model_len=8192,
        kv_bytes_per_token=131_072,  # 2 x 32 layers x 8 KV heads x 128 dims x 2 bytes (bf16)
        formats=[
            ModelFormat(name="bf16", weight_bytes=16_060_000_000, min_compute_capability="8.0"),
            ModelFormat(name="fp8", weight_bytes=8_030_000_000, min_compute_capability="8.9"),
            ModelFormat(name="awq", weight_bytes=5_730_000_000, min_compute_capability="7.5"),
        ],
    )
    settings = WorkerSettings(engine="vllm", model=example.name)
    try:
        plan = plan_for(settings, profile, example, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except NoFormatFits as exc:
        return None, str(exc)
    return plan.model_format, plan.reason


def main() -> None:
    import json

    profile = profile_node()
    chosen, why = example_format_choice(profile)
    out: dict[str, Any] = {"profile": profile.model_dump(mode="json"), "example_model": "llama-3.1-8b-instruct"}
    out["chosen_format"], out["format_choice"] = chosen, why
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
