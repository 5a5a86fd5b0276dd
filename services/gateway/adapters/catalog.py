"""What /v1/models lists: models declared on llm.models and models the fleet serves (llm.workers).

The runtime follows both topics from their start (no group) and feeds every record to `on_model` and
`on_worker`; a record that does not decode goes to llm.dlq with the reason and the catalog goes on.
"""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from llmbus.bus import decode
from llmbus.contract.messages import ModelSpec, WorkerState, WorkerStatus, now_ms
from llmbus.domain.adapters import lora_adapter_of


class ModelCatalog:
    """The latest model specs and worker heartbeats."""

    def __init__(self, worker_stale_s: float) -> None:
        self.specs: dict[str, ModelSpec] = {}
        self.workers: dict[str, WorkerStatus] = {}
        self.stale_ms = worker_stale_s * 1000

    async def on_model(self, record: ConsumerRecord) -> None:
        """A model declared on llm.models (a tombstone changes nothing: a model once listed stays)."""
        if record.value is not None:
            spec = decode(record, ModelSpec)  # BadMessage: llm.dlq says why, the catalog goes on without it
            if spec.record == "serving":  # a version's registry record is not a model clients can ask for
                self.specs[spec.name] = spec

    async def on_worker(self, record: ConsumerRecord) -> None:
        """A worker's heartbeat on llm.workers (a tombstone of a collected worker changes nothing)."""
        if record.value is not None:
            status = decode(record, WorkerStatus)
            self.workers[status.worker_id] = status

    def knows(self, model: str) -> bool:
        """Declared, or served by some worker we have heard of (a dead one's model is 503, not 404)."""
        return model in self.specs or any(model in w.models for w in self.workers.values())

    def _live(self, at_ms: int) -> list[WorkerStatus]:
        return [w for w in self.workers.values() if not w.state.ended and at_ms - w.sent_at_ms <= self.stale_ms]

    def serving(self, model: str, at_ms: int | None = None) -> list[WorkerStatus]:
        """The last heartbeats of the live workers serving `model` (a LoRA adapter: its base's that load adapters)."""
        live = self._live(now_ms() if at_ms is None else at_ms)
        adapter = lora_adapter_of(self.specs.get(model))
        if adapter is not None:
            return [w for w in live if adapter.base_model in w.models and w.max_loras > 0]
        return [w for w in live if model in w.models]

    def listing(self, at_ms: int | None = None) -> list[dict[str, object]]:
        live = self._live(now_ms() if at_ms is None else at_ms)
        names = sorted(set(self.specs) | {m for w in live for m in w.models})
        out = []
        for name in names:
            spec = self.specs.get(name)
            serving = self.serving(name, at_ms)
            adapter = lora_adapter_of(spec)
            out.append(
                {
                    "id": name,
                    "object": "model",
                    "created": min((w.started_at_ms for w in serving), default=0) // 1000,
                    "owned_by": "llmbus",
                    **({"parent": adapter.base_model} if adapter is not None else {}),  # as vLLM lists its LoRA modules
                    "llmbus": {
                        "version": spec.version if spec else None,
                        "tier": spec.tier if spec else None,
                        "max_model_len": spec.max_model_len
                        if spec
                        else max((w.max_model_len for w in serving), default=0),
                        "workers_ready": sum(1 for w in serving if w.state == WorkerState.READY),
                    },
                }
            )
        return out
