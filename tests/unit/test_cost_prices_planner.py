"""Price arithmetic (Decimal, µUSD, half to even), price-book validation, splits, and the planner's figures."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from llmbus_services.cost_accounting.core.budgets import BudgetPolicy, Period, crossed, period_key, state_of
from llmbus_services.cost_accounting.core.money import cents, split, to_micro
from llmbus_services.cost_accounting.core.planner import PlanInputs, plan
from llmbus_services.cost_accounting.core.prices import HostedPrice, PriceBook, SelfHostedRate, load_pricebook

_PRICES = st.decimals(min_value=0, max_value=200, places=6, allow_nan=False, allow_infinity=False)
_TOKENS = st.integers(min_value=0, max_value=10_000_000)


def test_rounding_is_half_even_to_the_micro_dollar() -> None:
    assert to_micro(Decimal("2.5")) == 2 and to_micro(Decimal("3.5")) == 4
    # 3 tokens at $0.15 / 1M = 0.45 µUSD -> 0; 5 tokens -> 0.75 -> 1
    price = HostedPrice(input_per_1m=Decimal("0.15"), output_per_1m=Decimal("0.60"))
    assert price.cost_micro(3, 0, 0) == 0 and price.cost_micro(5, 0, 0) == 1
    # a float in YAML is read through its shortest repr: 0.1 is exactly 1/10
    assert PriceBook.model_validate(
        {"default_model": "m", "hosted": {"m": {"input_per_1m": 0.1, "output_per_1m": 0.3}}}
    ).hosted["m"].input_per_1m == Decimal("0.1")
    assert cents(12_345) == Decimal("0.01") and cents(15_000) == Decimal("0.02") and cents(25_000) == Decimal("0.02")


@given(_PRICES, st.none() | _PRICES, _PRICES, _TOKENS, _TOKENS, _TOKENS)
def test_integer_pricing_equals_the_decimal_definition(
    p_in: Decimal, p_cached: Decimal | None, p_out: Decimal, prompt: int, cached: int, completion: int
) -> None:
    """The hot path prices in integers; the definition is Decimal arithmetic rounded once, half to even."""
    price = HostedPrice(input_per_1m=p_in, cached_input_per_1m=p_cached, output_per_1m=p_out)
    cached = min(cached, prompt)
    exact = (prompt - cached) * p_in + cached * (p_in if p_cached is None else p_cached) + completion * p_out
    assert price.cost_micro(prompt, cached, completion) == to_micro(exact)


@given(st.decimals(min_value="0.01", max_value=500, places=4), st.integers(min_value=0, max_value=10**10))
def test_gpu_time_pricing_equals_the_decimal_definition(per_hour: Decimal, instance_ms: int) -> None:
    rate = SelfHostedRate(
        pool="p", gpu="g", capacity="spot", usd_per_instance_hour=per_hour, reference_per_1m_tokens=Decimal(0)
    )
    # µUSD = ms x USD/hour x 1e6 / 3.6e6, exact as a fraction before the one rounding
    numerator, denominator = (instance_ms * per_hour * 10).as_integer_ratio()
    assert rate.cost_micro(instance_ms) == to_micro(Decimal(numerator) / Decimal(denominator * 36))


def test_cached_input_has_its_own_price() -> None:
    book = load_pricebook()
    # gpt-4.1-mini: 800 x 0.40 + 200 x 0.10 + 100 x 1.60 = 500 µUSD
    assert book.hosted["gpt-4.1-mini"].cost_micro(1000, 200, 100) == 500


def test_spot_defaults_to_the_fraction_and_overhead_applies() -> None:
    book = load_pricebook()
    rate = book.pool_rate("sim")  # A100 spot = 1.50 x 0.30 = 0.45, x 1.10 overhead
    assert rate.usd_per_instance_hour == Decimal("0.4950")
    assert rate.cost_micro(3_600_000) == 495_000
    assert book.pool_rate("llama-70b").usd_per_instance_hour == Decimal("2.80") * 4 * Decimal("1.10")


def test_price_book_is_strict() -> None:
    with pytest.raises(ValidationError):
        PriceBook.model_validate(
            {"default_model": "m", "hosted": {"m": {"input_per_1m": 1, "output_per_1m": 1, "x": 1}}}
        )
    with pytest.raises(ValidationError, match="no price"):
        PriceBook.model_validate({"default_model": "nope"})
    with pytest.raises(ValidationError, match="gpu"):
        PriceBook.model_validate(
            {
                "default_model": "m",
                "hosted": {"m": {"input_per_1m": 1, "output_per_1m": 1}},
                "pools": {"p": {"gpu": "B200", "models": ["x"]}},
            }
        )


@pytest.mark.parametrize(
    ("pool", "error"),
    [
        ({"cpu_node": "c16", "gpu": "A100-80GB", "models": ["x"]}, "exactly one"),
        ({"models": ["x"]}, "exactly one"),
        ({"cpu_node": "c32", "models": ["x"]}, "cpu_node 'c32' has no price"),
    ],
)
def test_a_pool_runs_on_gpus_or_on_a_priced_cpu_node(pool: dict[str, object], error: str) -> None:
    book = {
        "default_model": "m",
        "hosted": {"m": {"input_per_1m": 1, "output_per_1m": 1}},
        "gpus": {"A100-80GB": {"on_demand_per_hour": 1.5}},
        "cpu_nodes": {"c16": {"on_demand_per_hour": 0.5}},
    }
    with pytest.raises(ValidationError, match=error):
        PriceBook.model_validate(book | {"pools": {"p": pool}})
    spot = PriceBook.model_validate(book | {"pools": {"p": {"cpu_node": "c16", "capacity": "spot", "models": ["x"]}}})
    assert spot.pool_rate("p").usd_per_instance_hour == Decimal("0.5") * Decimal("0.3")  # spot_fraction, overhead 1


def test_split_is_exact_and_fair() -> None:
    assert split(10, [1, 1, 1]) == [4, 3, 3]
    assert split(100, [3, 1]) == [75, 25]
    assert split(7, [0, 0]) == [0, 0]
    assert sum(split(1_000_003, [0.1, 0.7, 0.2, 1e-9])) == 1_000_003


def test_budget_thresholds() -> None:
    policy = BudgetPolicy()
    limit = Decimal("10")
    assert crossed(policy, 4_999_999, limit) is None
    assert crossed(policy, 5_000_000, limit) == 50
    assert crossed(policy, 10_000_000, limit) == 100
    assert state_of(80).value == "warn" and state_of(100).value == "over"
    assert period_key(Period.MONTH, 1_780_000_000_000) == "2026-05"


def test_planner_reproduces_the_case_study_with_its_corrections() -> None:
    p = plan(PlanInputs())
    by_name = {s.name: s for s in p.scenarios}
    base = by_name["baseline (hourly autoscaling)"]
    # 100,000 / 39 weighted hours = 2,564/h off-peak -> 6 instances; 10,256/h at peak -> 21
    assert base.instances_by_hour.count(21) == 5 and base.instances_by_hour.count(6) == 19
    assert base.gpu_hours_per_month == 219 * 30
    assert round(base.gpu_usd_per_month, 2) == 2956.50
    assert by_name["static, provisioned for the peak"].gpu_hours_per_month == 21 * 24 * 30
    assert round(by_name["peak batching"].gpu_usd_per_month) == round((14 * 5 + 6 * 19) * 30 * 0.45)
    assert round(by_name["tiered: 8B distilled + strong API"].api_usd_per_month) == 11_700
    assert len(p.checks) == 5
