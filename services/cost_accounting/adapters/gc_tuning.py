"""The collector's settings for a process that decodes results in large batches (LLMBUS_COST_GC_*)."""

from __future__ import annotations

import gc


def tune_gc(freeze: bool, gen0_threshold: int) -> None:
    """Call once start-up is done: what it built is frozen out of full passes; gen 0 collected less often."""
    if freeze:
        # What start-up built (modules, schemas, the broker, the ledger) lives as long as the
        # process: out of the collector's full passes, which on a backlog otherwise walked it
        # again every few thousand results (a third of the CPU of decoding them).
        gc.collect()
        gc.freeze()
    if gen0_threshold:
        # A batch allocates tens of thousands of short-lived objects (none in cycles): collecting
        # the young generation every 700 allocations walked each batch's live objects over and over.
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(gen0_threshold, gen1, gen2)
