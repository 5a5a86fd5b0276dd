"""Prometheus metrics of cost-accounting (llmbus_ namespace, units in names).

Tenants and models label the cost series only as far as they are known (llmbus.observability.
metric_children): models from the price book and the fleet's heartbeats, tenants with a budget and the
first ones seen; anything else is `other`, so a client choosing names cannot grow the series.
"""

from collections.abc import Iterable

from prometheus_client import Counter, Gauge

from llmbus.observability.metric_children import MODEL_LABELS, TENANT_LABELS, children_of, model_label
from llmbus_services.cost_accounting.core.prices import PriceBook

COST_USD = Counter("llmbus_cost_usd_total", "Cost booked, USD", ["tenant", "model", "kind"])
TOKENS = Counter("llmbus_cost_tokens_total", "Tokens costed", ["tenant", "model", "type"])
SAVING_USD = Counter("llmbus_cost_saving_usd_total", "Cache savings, USD", ["tenant", "model"])
RESULTS = Counter("llmbus_cost_results_total", "Results seen on llm.results", ["outcome"])
BUDGET_ALERTS = Counter("llmbus_cost_budget_alerts_total", "BudgetStatus alerts published", ["threshold"])
STATE_REBUILDS = Counter(
    "llmbus_cost_state_rebuilds_total", "Redis lost cost-accounting's state: markers rebuilt from llm.costs"
)
WRITES_LOST = Counter(
    "llmbus_cost_redis_writes_lost_total",
    "Redis lost writes it had acknowledged (a restart, a failover): records on llm.costs applied again",
)
HELD_OPEN = Gauge("llmbus_cost_held_open_results", "Self-hosted results held uncommitted on llm.results until billed")
LATE_RESULTS = Counter("llmbus_cost_late_results_total", "Self-hosted results after their interval closed")

# Children looked up once per label set (llmbus.observability.metric_children): a backlog batch touches hundreds
# of label sets, and `labels()` (validation, a lock) cost more than the sums behind them.
_cost_usd = children_of(COST_USD)
_tokens = children_of(TOKENS)
_saving_usd = children_of(SAVING_USD)


def _who(who: str) -> str:
    """A tenant's label, bounded; `_shadow`, `_platform` (who pays when no tenant does) stay as they are."""
    return who if who.startswith("_") else TENANT_LABELS.label(who)


def cost_usd(who: str, model: str | None, kind: str) -> Counter:
    return _cost_usd(_who(who), model_label(model), kind)


def tokens(who: str, model: str | None, kind: str) -> Counter:
    return _tokens(_who(who), model_label(model), kind)


def saving_usd(who: str, model: str | None) -> Counter:
    return _saving_usd(_who(who), model_label(model))


def learn_price_book(book: PriceBook, budget_tenants: Iterable[str] = ()) -> None:
    """The models the price book prices (hosted and self-hosted) and the tenants with a budget are known."""
    MODEL_LABELS.learn([*book.hosted, *(model for pool in book.pools.values() for model in pool.models)])
    TENANT_LABELS.learn(budget_tenants)
