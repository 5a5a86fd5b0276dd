"""The fleet followed: heartbeats, node profiles and models into the core's view; a cancel of a queued request."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from llmbus.bus import decode
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Control,
    ControlAction,
    ErrorCode,
    ErrorInfo,
    ModelSpec,
    NodeProfile,
    WorkerStatus,
    now_ms,
)
from llmbus.contract.request_key import RequestKey
from llmbus.observability.metric_children import MODEL_LABELS
from llmbus_services.scheduler.core.scheduler import FinalError
from llmbus_services.scheduler.flows.placement import PlacementFlow


class FleetFlow(PlacementFlow):
    async def on_fleet(self, record: ConsumerRecord) -> None:
        base = record.topic.removeprefix(self.bus.topics.prefix)
        if base == t.WORKERS:
            status = decode(record, WorkerStatus)
            MODEL_LABELS.learn(status.models)  # the fleet's models label metrics as themselves
            replayed = self.replayed(record)  # written before we started
            async with self._lock:
                await self._publish(self.core.on_heartbeat(status, now_ms(), replayed))
        elif base == t.NODES:
            self.core.on_node(decode(record, NodeProfile))
        elif base == t.MODELS:
            spec = decode(record, ModelSpec)
            self.core.on_model(spec)
            MODEL_LABELS.learn([spec.name])
        elif base == t.CONTROL:
            control = decode(record, Control)
            if control.action != ControlAction.CANCEL:
                return
            async with self._lock:
                # The target is the request's key (tenant and id): a tenant cancels its own requests only.
                request = self.core.cancel(RequestKey(control.target_id))  # a queued one; a placed one is its worker's
                if request is not None:
                    await self._publish([FinalError(request, ErrorInfo.of(ErrorCode.CANCELLED, "cancelled"))])
