"""Which records of llm.models are LoRA adapters, and what a request names (pure).

The one place that reads an adapter out of a model record: the router (what a request's `model` or
`adapter` resolves to) and the gateway (what /v1/models lists, which workers serve it) ask here. An
adapter's record is a ModelSpec with `lora` set: `llmbus models push` / `register -f` with an adapter
manifest (llmbus.contract.manifest, its `adapter` section) writes one, its source the root of the version's
artifact of format `lora`, its base model in the lineage too.
"""

from __future__ import annotations

from llmbus.contract.messages import LoraAdapter, ModelSpec


class AdapterNotServed(ValueError):
    """A request names an adapter the catalog does not hold, or one of another base model."""


def lora_adapter_of(spec: ModelSpec | None) -> LoraAdapter | None:
    """The LoRA adapter `spec` describes, or None for a plain model (or no record)."""
    return spec.lora if spec is not None else None


def named_adapter(model: str | None, adapter_name: str | None, adapters: dict[str, LoraAdapter]) -> str | None:
    """The served name a request resolves to when it names `adapter_name` beside its base `model` (None: it
    names none, its `model` stands). Raises AdapterNotServed for an unknown adapter or another base's."""
    if adapter_name is None:
        return None
    adapter = adapters.get(adapter_name)
    if adapter is None:
        raise AdapterNotServed(f"LoRA adapter {adapter_name!r} is not in the catalog")
    if model is not None and model not in (adapter.base_model, adapter.name):
        raise AdapterNotServed(f"LoRA adapter {adapter_name!r} is of {adapter.base_model!r}, not of {model!r}")
    return adapter.name
