"""The engine's LoRA adapter slots (pure): which adapters are loaded, least recently used first, bounded.

An engine with slots loads an adapter when a request names it and, with every slot taken, evicts the
least recently used one (vLLM's LRU adapter cache does the same; the vllm engine keeps this mirror in
step with vLLM's own list). The heartbeat reports the loaded ones in this order
(WorkerStatus.lora_adapters) and the scheduler's adapter-affinity scorer reads it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from llmbus.contract.messages import LoraAdapter


class AdapterRefused(ValueError):
    """The adapter cannot run on this engine: another base model, or a rank above the engine's maximum."""


@dataclass(frozen=True)
class Use:
    adapter_id: int  # stable per adapter name for the engine's lifetime (vLLM's lora_int_id, > 0)
    loads: bool  # not loaded before this use
    evicted: tuple[str, ...]  # what it pushed out of the slots


@dataclass
class AdapterSlots:
    max_loras: int
    max_lora_rank: int
    base_model: str
    _loaded: OrderedDict[str, int] = field(default_factory=OrderedDict)  # name → id, least recently used first
    _ids: dict[str, int] = field(default_factory=dict)

    def check(self, adapter: LoraAdapter) -> None:
        if adapter.base_model != self.base_model:
            raise AdapterRefused(
                f"adapter {adapter.name!r} is of {adapter.base_model!r}, this engine serves {self.base_model!r}"
            )
        if adapter.rank > self.max_lora_rank:
            raise AdapterRefused(
                f"adapter {adapter.name!r} has rank {adapter.rank} > max_lora_rank {self.max_lora_rank}"
            )

    def use(self, adapter: LoraAdapter) -> Use:
        """Mark `adapter` used now: loaded if it was not, the least recently used evicted past the slots."""
        self.check(adapter)
        adapter_id = self._ids.setdefault(adapter.name, len(self._ids) + 1)
        loads = adapter.name not in self._loaded
        self._loaded[adapter.name] = adapter_id
        self._loaded.move_to_end(adapter.name)
        evicted = []
        while len(self._loaded) > self.max_loras:
            name, _ = self._loaded.popitem(last=False)
            evicted.append(name)
        return Use(adapter_id, loads, tuple(evicted))

    def keep_only(self, adapter_ids: set[int]) -> None:
        """What the engine reports loaded wins: an adapter it no longer holds leaves the mirror."""
        for name in [n for n, i in self._loaded.items() if i not in adapter_ids]:
            del self._loaded[name]

    @property
    def loaded(self) -> list[str]:
        return list(self._loaded)
