"""The control flow: a cancel aborts the request it names; a drain takes this worker out of placement;
after the handover grace the answers that can be continued are handed over mid-stream (their next leg
goes on elsewhere), and the drain's last step aborts what still runs, so it is handed back."""

from __future__ import annotations

import logging

from aiokafka.structs import ConsumerRecord

from llmbus.bus import decode
from llmbus.contract.messages import (
    Control,
    ControlAction,
)
from llmbus_services.engine_worker.flows.dispatch import DispatchFlow

log = logging.getLogger(__name__)


class ControlFlow(DispatchFlow):
    async def on_control(self, record: ConsumerRecord) -> None:
        control = decode(record, Control)
        # A cancel names the request by its key (tenant and request id): one tenant cannot cancel another's.
        if control.action == ControlAction.CANCEL and control.target_id in self.running:
            await self.engine.abort(control.target_id)
        elif control.action == ControlAction.DRAIN and control.target_id == self.settings.worker_id:
            self.draining = True
            if self.on_drain is not None:
                await self.on_drain()

    async def hand_over(self) -> None:
        """A drain's handover: every answer running here that can be continued is aborted, its chunks
        acknowledged and the request handed back mid-stream; its next worker continues it."""
        keys = [key for key in self.running if key in self.continuable]
        if keys:
            log.info("handing over %d answers mid-stream", len(keys))
        for key in keys:
            await self.engine.abort(key)

    async def abort_all(self) -> None:
        """Drain's last step: whatever still runs is aborted and handed back to the scheduler."""
        for key in list(self.running):
            await self.engine.abort(key)
