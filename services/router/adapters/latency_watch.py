"""Feeding the tier latency watch from llm.results, and reporting it (metrics + a status line on change)."""

from __future__ import annotations

import logging
import time

from prometheus_client import Gauge

from llmbus.contract.messages import InferenceResult, ResultStatus
from llmbus_services.router.core.latency import TierLatencyWatch, TierVerdict
from llmbus_services.router.core.pipeline import RouterCore

log = logging.getLogger(__name__)
TIER_TTFT_MS = Gauge("llmbus_router_tier_ttft_ms", "TTFT quantile per tier over the watch window", ["tier"])
TIER_TARGET_MS = Gauge("llmbus_router_tier_ttft_target_ms", "TTFT target per tier", ["tier"])
TIER_MISSING = Gauge("llmbus_router_tier_latency_missing", "1 while a tier misses its TTFT target", ["tier"])


class LatencyReporter:
    def __init__(self, core: RouterCore, watch: TierLatencyWatch) -> None:
        self.core = core
        self.watch = watch
        self._missing: dict[str, bool] = {}

    def on_result(self, result: InferenceResult, now_s: float | None = None) -> TierVerdict | None:
        """Count one result's TTFT for its model's tier; returns that tier's verdict after it."""
        if result.status != ResultStatus.OK or result.cached or result.shadow or not result.model:
            return None
        ttft = result.timings.ttft_ms if result.timings else None
        if ttft is None:
            return None
        now_s = time.time() if now_s is None else now_s
        tier = self.core.tier_of(result.model)
        self.watch.observe(tier, ttft, now_s)
        verdict = self.watch.verdict(tier, now_s)
        if verdict is not None:
            self._report(verdict)
        return verdict

    def _report(self, v: TierVerdict) -> None:
        TIER_TARGET_MS.labels(v.tier).set(v.target_ms)
        if v.observed_ms is not None:
            TIER_TTFT_MS.labels(v.tier).set(v.observed_ms)
        TIER_MISSING.labels(v.tier).set(1 if v.missing else 0)
        if self._missing.get(v.tier, False) != v.missing:
            self._missing[v.tier] = v.missing
            (log.warning if v.missing else log.info)("%s", v.line())

    def status_lines(self, now_s: float | None = None) -> list[str]:
        return [v.line() for v in self.watch.verdicts(time.time() if now_s is None else now_s)]
