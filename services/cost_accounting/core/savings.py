"""Savings report: what routing, caching and trimming saved against "every request to the default
model, untrimmed, uncached", computed from the totals of the CostRecords (pure).

For the requests booked to tenants (shadow copies and idle GPU time excluded):
  baseline   = sum of each request's untrimmed tokens at the default model's list price
  actual     = sum of what each request was billed
  trimming   = trimmed prompt tokens at the default model's input price
  caching    = cache hits at the list price of the model that would have served them
  routing    = sum over the requests the router sent elsewhere of (default list price - routed
               model's list price) on the tokens actually used (negative when it chose a dearer model)
  other      = baseline - actual - the three above: the provider's prompt-cache discount and the
               gap between a self-hosted model's reference price and its GPU-time cost.
Output caps are reported apart, as an upper bound (`output_caps_usd`): for the answers that stopped at
the cap, the tokens between the cap and the client's max_tokens at the model's list output price. What
the model would really have written there is unknowable, so it is not part of the sum above.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from decimal import Decimal

from llmbus_services.cost_accounting.core.money import usd
from llmbus_services.cost_accounting.core.prices import PriceBook


@dataclass(frozen=True)
class Savings:
    baseline_usd: float
    actual_usd: float
    trimming_usd: float
    caching_usd: float
    routing_usd: float
    other_usd: float
    output_caps_usd: float = 0.0  # an upper bound, outside the decomposition of baseline - actual

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def savings(totals: dict[str, int], book: PriceBook) -> Savings:
    """`totals`: the metrics of one tenant (or of all tenants) from the aggregates."""
    baseline, actual = totals.get("baseline", 0), totals.get("cost", 0)
    default_input = book.hosted[book.default_model].input_per_1m if book.default_model in book.hosted else Decimal(0)
    trimming = int(totals.get("trimmed", 0) * default_input)
    caching = totals.get("saving", 0)
    # baseline without trimming, minus the list price of what was routed (cache hits included there)
    routing = baseline - trimming - totals.get("list", 0)
    other = baseline - actual - trimming - caching - routing
    capped = totals.get("capped", 0)
    return Savings(usd(baseline), usd(actual), usd(trimming), usd(caching), usd(routing), usd(other), usd(capped))
