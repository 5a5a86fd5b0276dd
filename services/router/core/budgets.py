"""Tenants' budget states, as cost-accounting last published them on llm.budgets (compacted).

The topic is the source of truth and is compacted, so every router replica rebuilds the
same view by reading it from the beginning; no Redis copy is needed. Unknown tenants are
OK: a router must not refuse traffic because cost-accounting has not spoken yet.
"""

from __future__ import annotations

from llmbus.contract.messages import BudgetState, BudgetStatus


class BudgetBook:
    def __init__(self) -> None:
        self._by_tenant: dict[str, BudgetStatus] = {}

    def apply(self, status: BudgetStatus | None, tenant: str | None = None) -> None:
        """Newest wins by updated_at_ms (a replayed old record must not undo a newer one); None is a tombstone."""
        if status is None:
            if tenant:
                self._by_tenant.pop(tenant, None)
            return
        current = self._by_tenant.get(status.tenant)
        if current is None or status.updated_at_ms >= current.updated_at_ms:
            self._by_tenant[status.tenant] = status

    def state_of(self, tenant: str) -> BudgetState:
        status = self._by_tenant.get(tenant)
        return status.state if status else BudgetState.OK
