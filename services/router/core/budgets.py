"""Tenants' budget states, as cost-accounting last published them on llm.budgets (compacted).

The topic is the source of truth and is compacted, so every router replica rebuilds the
same view by reading it from the beginning; no Redis copy is needed. Unknown tenants are
OK: a router must not refuse traffic because cost-accounting has not spoken yet.
"""

from __future__ import annotations

from datetime import UTC, datetime

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

    def resets_in_ms(self, tenant: str, now_ms: int) -> int | None:
        """Until the tenant's budget period ends (UTC midnight, or the first of the next month); None when
        its period is not known."""
        status = self._by_tenant.get(tenant)
        if status is None or status.period not in ("day", "month"):
            return None
        now = datetime.fromtimestamp(now_ms / 1000, UTC)
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        if status.period == "day":
            ends_ms = start.timestamp() * 1000 + 86_400_000
        else:
            month = start.replace(day=1)
            ends = (
                month.replace(year=month.year + 1, month=1)
                if month.month == 12
                else month.replace(month=month.month + 1)
            )
            ends_ms = ends.timestamp() * 1000
        return max(1, round(ends_ms - now_ms))
