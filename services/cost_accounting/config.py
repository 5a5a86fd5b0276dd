"""Cost-accounting settings (env prefix LLMBUS_COST_)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class CostSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_COST_", extra="ignore")

    pricebook_path: str | None = None  # None: services/cost_accounting/policies/default.yaml
    budgets_path: str | None = None  # None: services/cost_accounting/policies/budgets.yaml
    # GPU ledger: interval length (must divide an hour), how long results of an interval may
    # still arrive after it ends, and after how long without heartbeat a worker counts as gone.
    interval_s: int = 60
    grace_s: float = 30.0
    worker_expiry_s: float = 60.0
    close_every_s: float = 1.0
    settle_s: float = (
        2.0  # no interval closes while llm.results is read in full batches (a backlog), nor this long after
    )
    cold_start_requests: int = 100  # cold start is shared by this many first requests of an instance
    prefill_token_weight: float = 0.25  # GPU work of a prefill token relative to a decode token
    decode_token_weight: float = 1.0
    dedupe_ttl_s: int = 30 * 24 * 3600  # results replayed within this window are never billed twice
    batch_max_records: int = 2000  # a backlog in few large batches: fewer round trips and smaller scripts per result
    # A batch of llm.results at least this large means a backlog is being read (a fetch of one
    # partition may hold fewer records than batch_max_records: it does not decide this).
    backlog_batch_records: int = 500
    # After a Redis data loss: how long reading llm.costs back (to mark what was billed) may take.
    rebuild_timeout_s: float = 120.0
    gc_freeze: bool = True  # after start-up, its objects are left out of garbage collection
    gc_gen0_threshold: int = 50_000  # allocations between young-generation collections (0: Python's 700)
