"""archive wiring: five declared subscriptions (llmbus.contract.contracts.ARCHIVE), each read in batches.

  llm.results      group llmbus.archive.results
  llm.costs        group llmbus.archive.costs
  llm.comparisons  group llmbus.archive.comparisons
  llm.feedback     group llmbus.archive.feedback  (auth on: by pattern, and every llm.feedback.<tenant>)
  llm.requests     group llmbus.archive.requests  (auth on: by pattern; LLMBUS_ARCHIVE_PROMPTS=false: not read)
A batch's offsets are committed after its files and manifest are in place in every target (the directory:
llmbus_services.archive.adapters.store; a bucket: .bucket_store);
a batch that raises goes to llm.dlq record by record, a transient failure is retried in place.
"""

from __future__ import annotations

import asyncio

from llmbus.archive.rows import KINDS_BY_NAME
from llmbus.bus.service import ServiceRuntime
from llmbus.contract import contracts
from llmbus.security import tenancy
from llmbus.settings import BusSettings
from llmbus_services.archive.adapters.targets import open_targets
from llmbus_services.archive.config import ArchiveSettings
from llmbus_services.archive.flows import ArchiveHandlers

PATTERNS = {"feedback": tenancy.feedback_topic_pattern, "requests": tenancy.request_topic_pattern}


def build(runtime: ServiceRuntime, cfg: ArchiveSettings) -> ArchiveHandlers:
    handlers = ArchiveHandlers(open_targets(cfg), runtime.topics, runtime.dead_letter)
    fetch: dict[str, object] = {"fetch_max_wait_ms": cfg.fetch_max_wait_ms, "fetch_min_bytes": cfg.fetch_min_bytes}
    for name, kind in KINDS_BY_NAME.items():
        if name == "requests" and not cfg.prompts:
            continue
        pattern = PATTERNS[name](runtime.topics.prefix) if name in PATTERNS and runtime.settings.auth_enabled else None
        runtime.subscribe(
            name,
            handlers.on_batch(kind),
            pattern=pattern,
            consumer_options=fetch,
            batch_max_records=cfg.batch_max_records,
        )
    return handlers


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    await ServiceRuntime.serve(settings, contracts.ARCHIVE, lambda runtime: build(runtime, ArchiveSettings()), stop)
