"""cost-accounting's flows: each turns records into calls on core/ and bills what they price.

- billing.py      llm.results -> CostRecords: stage, publish, apply (once), held results, Redis data loss
- ledger.py       the timer: the owned workers' final GPU intervals closed and billed
- write_loss.py   the timer: writes Redis acknowledged and then lost, applied again from llm.costs
- priced_with.py  llm.workers, llm.pricebook, llm.scaling: what the bills are priced with
"""

from llmbus_services.cost_accounting.flows.billing import HeldResult
from llmbus_services.cost_accounting.flows.ledger import LedgerFlow
from llmbus_services.cost_accounting.flows.priced_with import PricedWithFlow


class CostHandlers(LedgerFlow, PricedWithFlow):
    """Every flow of cost-accounting over one state (ledger, holds, leases), wired in app.py."""


__all__ = ["CostHandlers", "HeldResult"]
