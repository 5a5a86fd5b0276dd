"""LoRA adapters: a fine-tune served on a shared base model's workers (vLLM's LoRARequest).

An adapter has its own served name, which a request names as its `model` (OpenAI-style, as `vllm serve
--lora-modules` and LiteLLM expose adapters) or as `adapter` beside its base model. Its record on
llm.models is a ModelSpec whose `lora` says which base model's workers load it and where its files are;
the router puts the adapter on the routed request, the scheduler places it on a worker of the base model
(preferring one that has it loaded), and the worker loads it on demand into a bounded set of slots.
"""

from __future__ import annotations

from pydantic import Field

from llmbus.contract.messages.base import Part

ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9_.:-]+$"


class LoraAdapter(Part):
    """One LoRA adapter: its served name, its base model, where its files are, and its rank."""

    name: str = Field(min_length=1, max_length=256, pattern=ADAPTER_NAME_PATTERN, description="The served name.")
    base_model: str = Field(min_length=1, max_length=256, description="The model whose workers load it.")
    source: str = Field(
        min_length=1,
        max_length=2048,
        description="Its files (adapter_config.json, adapter_model.safetensors): a local directory, 'file:///<dir>/',"
        " or an artifact root in the object store ('s3://<bucket>/<prefix>/').",
    )
    rank: int = Field(default=8, ge=1, le=512, description="LoRA rank r; a worker loads it if r <= its max_lora_rank.")
    version: str = Field(default="1", max_length=64, description="The adapter's version (its registry record's).")
