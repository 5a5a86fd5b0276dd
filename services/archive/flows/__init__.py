"""archive's flow: batches of llm.results, llm.costs, llm.comparisons, llm.feedback and llm.requests
into Parquet files by day and tenant (batches.py), each record id once."""

from llmbus_services.archive.flows.batches import ArchiveHandlers

__all__ = ["ArchiveHandlers"]
