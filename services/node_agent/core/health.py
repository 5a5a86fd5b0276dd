"""A node's health from its GPUs' ECC counters (pure): ok, degraded (drain high-priority work), unhealthy.

Corrected (single-bit) errors are fixed by ECC, but a rising count is memory wearing out: the node keeps
low-priority work and loses the work whose latency or correctness matters most. Uncorrected (double-bit)
errors may have corrupted data: no work at all until the GPU is reset (its volatile counters clear).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmbus.contract.messages import NodeHealth, NodeProfile


@dataclass(frozen=True)
class EccThresholds:
    corrected_degraded_above: int = 100
    uncorrected_unhealthy_above: int = 0


def judge(profile: NodeProfile, thresholds: EccThresholds) -> tuple[NodeHealth, str]:
    """The node's health and why (the GPUs over a threshold, with their counts); ok with no reason."""
    checks = (
        (NodeHealth.UNHEALTHY, "uncorrected", thresholds.uncorrected_unhealthy_above),
        (NodeHealth.DEGRADED, "corrected", thresholds.corrected_degraded_above),
    )
    for health, kind, above in checks:
        counts = [(g.index, getattr(g, f"ecc_{kind}_volatile") or 0) for g in profile.gpus]
        over = [f"GPU {index}: {count} {kind} ECC errors" for index, count in counts if count > above]
        if over:
            return health, f"{'; '.join(over)} (> {above})"
    return NodeHealth.OK, ""
