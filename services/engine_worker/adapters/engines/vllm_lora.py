"""LoRA adapters on the vLLM engine: enable_lora with bounded slots, an adapter loaded on its first request.

vLLM loads an adapter when a request carries its LoRARequest and keeps up to max_cpu_loras of them (max_loras
per batch), evicting the least recently used (its LRUCacheWorkerLoRAManager). The worker mirrors that order
in AdapterSlots (core/lora_slots.py) and, after each adapter request, keeps only what vLLM lists as loaded
(`AsyncLLM.list_loras`), so the heartbeat says what is in vLLM's slots.

An adapter's files come from its `source`: a local directory or `file:///dir/` as it is, an object-store
artifact root (`s3://…`, what `llmbus models push` uploads for an adapter manifest) fetched into the node's
artifact cache and verified first (adapters/adapter_files.py), in a thread, on the adapter's first request.
"""

from __future__ import annotations

import logging
from typing import Any

from llmbus.contract.messages import LoraAdapter
from llmbus_services.engine_worker.adapters.adapter_files import AdapterFiles
from llmbus_services.engine_worker.adapters.engines.vllm_engine_config import VllmConfig
from llmbus_services.engine_worker.core.engine import RequestRejected
from llmbus_services.engine_worker.core.lora_slots import AdapterRefused, AdapterSlots

log = logging.getLogger(__name__)


def lora_engine_args(config: VllmConfig) -> dict[str, Any]:
    """The engine arguments that enable adapters (none when max_loras is 0)."""
    if config.max_loras <= 0:
        return {}
    return {
        "enable_lora": True,
        "max_loras": config.max_loras,
        "max_lora_rank": config.max_lora_rank,
        "max_cpu_loras": config.max_cpu_loras or config.max_loras,
    }


def adapter_slots(config: VllmConfig) -> AdapterSlots | None:
    """The mirror of vLLM's adapter cache: as many slots as vLLM keeps adapters loaded (max_cpu_loras)."""
    if config.max_loras <= 0:
        return None
    return AdapterSlots(config.max_cpu_loras or config.max_loras, config.max_lora_rank, config.model)


class VllmAdapters:
    """The LoRARequest of each request's adapter, and the slots' mirror kept in step with vLLM."""

    def __init__(self, slots: AdapterSlots, files: AdapterFiles | None = None) -> None:
        self.slots = slots
        self.files = files or AdapterFiles()

    async def request_for(self, adapter: LoraAdapter) -> Any:
        from vllm.lora.request import LoRARequest

        path = await self.files.directory(adapter)  # fetched from the object store first, where it is there
        try:
            use = self.slots.use(adapter)
        except AdapterRefused as refused:
            raise RequestRejected(str(refused)) from refused
        if use.loads:
            log.info("loading LoRA adapter %s (id %d); evicting %s", adapter.name, use.adapter_id, list(use.evicted))
        return LoRARequest(adapter.name, use.adapter_id, path, base_model_name=self.slots.base_model)

    async def reconcile(self, llm: Any) -> None:
        """vLLM's own list of loaded adapters wins over the mirror (an adapter that failed to load, an eviction)."""
        try:
            self.slots.keep_only(set(await llm.list_loras()))
        except Exception:  # a report only: the next adapter request tries again
            log.warning("could not list vLLM's loaded LoRA adapters", exc_info=True)
