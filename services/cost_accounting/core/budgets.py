"""Budgets: monthly or daily limits per tenant (YAML), alerts at 50 / 80 / 100 % once per period."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmbus.contract.messages import BudgetState

DEFAULT_BUDGETS_PATH = Path(__file__).resolve().parent.parent / "policies" / "budgets.yaml"


class Period(StrEnum):
    MONTH = "month"
    DAY = "day"


class TenantBudget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    limit_usd: Decimal = Field(gt=0)
    period: Period = Period.MONTH


class BudgetPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    thresholds_perc: list[int] = Field(default_factory=lambda: [50, 80, 100])
    tenants: dict[str, TenantBudget] = Field(default_factory=dict)

    @field_validator("thresholds_perc")
    @classmethod
    def _sorted(cls, value: list[int]) -> list[int]:
        if not value or sorted(set(value)) != value or value[0] <= 0:
            raise ValueError("thresholds_perc: increasing positive percentages, e.g. [50, 80, 100]")
        return value


def load_budgets(path: str | Path | None = None) -> BudgetPolicy:
    return BudgetPolicy.model_validate(yaml.safe_load(Path(path or DEFAULT_BUDGETS_PATH).read_text()) or {})


def period_key(period: Period, at_ms: int) -> str:
    """The UTC calendar period a cost falls in: 2026-11 or 2026-11-30."""
    at = datetime.fromtimestamp(at_ms / 1000, UTC)
    return at.strftime("%Y-%m") if period == Period.MONTH else at.strftime("%Y-%m-%d")


def crossed(policy: BudgetPolicy, spent_micro: int, limit_usd: Decimal) -> int | None:
    """The highest threshold (percent) the spending has reached, or None below the first."""
    spent_perc = Decimal(spent_micro) / (limit_usd * 10_000)  # µUSD / (USD x 1e6) x 100
    reached = [t for t in policy.thresholds_perc if spent_perc >= t]
    return reached[-1] if reached else None


def state_of(threshold_perc: int | None) -> BudgetState:
    if threshold_perc is None:
        return BudgetState.OK
    return BudgetState.OVER if threshold_perc >= 100 else BudgetState.WARN
