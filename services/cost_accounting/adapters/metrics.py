"""Prometheus metrics of cost-accounting (llmbus_ namespace, units in names)."""

from prometheus_client import Counter, Gauge

from llmbus.observability.metric_children import children_of

COST_USD = Counter("llmbus_cost_usd_total", "Cost booked, USD", ["tenant", "model", "kind"])
TOKENS = Counter("llmbus_cost_tokens_total", "Tokens costed", ["tenant", "model", "type"])
SAVING_USD = Counter("llmbus_cost_saving_usd_total", "Cache savings, USD", ["tenant", "model"])
RESULTS = Counter("llmbus_cost_results_total", "Results seen on llm.results", ["outcome"])
BUDGET_ALERTS = Counter("llmbus_cost_budget_alerts_total", "BudgetStatus alerts published", ["threshold"])
STATE_REBUILDS = Counter(
    "llmbus_cost_state_rebuilds_total", "Redis lost cost-accounting's state: markers rebuilt from llm.costs"
)
HELD_OPEN = Gauge("llmbus_cost_held_open_results", "Self-hosted results held uncommitted on llm.results until billed")
LATE_RESULTS = Counter("llmbus_cost_late_results_total", "Self-hosted results after their interval closed")

# Children looked up once per label set (llmbus.observability.metric_children): a backlog batch touches hundreds
# of label sets, and `labels()` (validation, a lock) cost more than the sums behind them.
cost_usd = children_of(COST_USD)
tokens = children_of(TOKENS)
saving_usd = children_of(SAVING_USD)
