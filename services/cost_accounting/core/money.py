"""Money arithmetic: integer micro-dollars, Decimal in between, one rounding rule.

Every amount the service stores or publishes is an integer number of micro-dollars
(1 µUSD = $0.000001). Prices are Decimals read from the YAML as strings (no binary float
ever touches a price). A product of a price and a quantity is rounded once, to the
micro-dollar, half to even (banker's rounding: no drift up or down over many records).
Sums of integers are exact, so a total in cents is the micro-dollar total rounded
half to even to the cent, and conservation laws hold to the micro-dollar, hence to the cent.

Splitting an amount among parts (a GPU interval among its requests) uses the largest
remainder method: floor of each exact share, then the leftover micro-dollars one each to
the largest fractional parts (ties: the earlier part). The parts always sum to the whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_HALF_EVEN, Decimal

MICRO_PER_USD = 1_000_000
_ONE = Decimal(1)
_CENT = Decimal("0.01")


def to_micro(amount: Decimal) -> int:
    """Round a Decimal number of micro-dollars to an integer, half to even."""
    return int(amount.quantize(_ONE, rounding=ROUND_HALF_EVEN))


def ratio(amount: Decimal) -> tuple[int, int]:
    """A Decimal as an exact fraction (numerator, denominator > 0)."""
    return amount.as_integer_ratio()


def div_micro(numerator: int, denominator: int) -> int:
    """numerator / denominator rounded to an integer, half to even, in integer arithmetic only.

    The same rounding as `to_micro` on the exact Decimal quotient, without Decimal's cost: the
    per-result prices are products of token counts and fractions, so they stay exact integers
    until this one division.
    """
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


def usd(micro: int) -> float:
    """For display and the float fields of messages only; sums use the integers."""
    return micro / MICRO_PER_USD


def cents(micro: int) -> Decimal:
    """The amount in dollars rounded half to even to the cent."""
    return (Decimal(micro) / MICRO_PER_USD).quantize(_CENT, rounding=ROUND_HALF_EVEN)


def split(total_micro: int, weights: Sequence[float | int]) -> list[int]:
    """`total_micro` shared by `weights` (largest remainder); zero weights get 0. Sum is exact.

    Float weights are first scaled to integers (1e-6 resolution relative to the largest), so
    the arithmetic below is exact integer arithmetic: same input, same split, on any machine.
    """
    if not weights:
        return []
    top = max(weights)
    if total_micro == 0 or top <= 0:
        return [0] * len(weights)
    units = [max(0, round(w * 1_000_000 / top)) for w in weights]
    unit_sum = sum(units)
    quotients = [divmod(total_micro * u, unit_sum) for u in units]
    parts = [q for q, _ in quotients]
    leftover = total_micro - sum(parts)
    by_remainder = sorted(range(len(units)), key=lambda i: (-quotients[i][1], i))
    for i in by_remainder[:leftover]:
        parts[i] += 1
    return parts
