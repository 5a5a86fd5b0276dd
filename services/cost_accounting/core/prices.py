"""The price book (YAML), validated by strict pydantic models before any record is costed.

Hosted models are priced per 1M input, cached-input and output tokens. Self-hosted pools
are priced per GPU-hour of their GPU type or per node-hour of their CPU node type (the onnx
engine, vLLM's CPU build), on demand or spot (spot defaults to
`spot_fraction` of on demand, ~30 % in the design source), times an overhead factor for
operations (networking, storage, people). Prices are Decimals: write them as strings or
plain numbers in the YAML (pydantic turns a YAML float into the Decimal of its shortest
repr, so 0.45 is exactly Decimal("0.45")).
"""

from __future__ import annotations

import fnmatch
import math
from decimal import Decimal
from enum import StrEnum
from functools import cached_property
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmbus.contract.config_file import StrictModel, load_yaml
from llmbus_services.cost_accounting.core.money import div_micro, ratio

DEFAULT_PRICEBOOK_PATH = Path(__file__).resolve().parent.parent / "policies" / "default.yaml"
MS_PER_HOUR = 3_600_000


class _Strict(StrictModel):
    model_config = ConfigDict(frozen=True)


class HostedPrice(_Strict):
    """USD per 1M tokens."""

    input_per_1m: Decimal = Field(ge=0)
    cached_input_per_1m: Decimal | None = Field(default=None, ge=0, description="Defaults to the input price.")
    output_per_1m: Decimal = Field(ge=0)

    @cached_property
    def exact(self) -> tuple[int, int, int, int]:
        """Input, cached-input and output price as numerators over one common denominator (exact).

        A cached_property, not a private attribute: it is read once per result, and pydantic's
        private-attribute lookup cost more than the pricing itself.
        """
        cached = self.input_per_1m if self.cached_input_per_1m is None else self.cached_input_per_1m
        fractions = [ratio(price) for price in (self.input_per_1m, cached, self.output_per_1m)]
        den = math.lcm(*(d for _, d in fractions))
        (n_in, d_in), (n_cached, d_cached), (n_out, d_out) = fractions
        return n_in * (den // d_in), n_cached * (den // d_cached), n_out * (den // d_out), den

    def cost_micro(self, prompt_tokens: int, cached_prompt_tokens: int, completion_tokens: int) -> int:
        """A price per 1M tokens in USD is a price per token in µUSD: tokens x price, rounded once."""
        cached = min(cached_prompt_tokens, prompt_tokens)
        n_in, n_cached, n_out, den = self.exact
        return div_micro((prompt_tokens - cached) * n_in + cached * n_cached + completion_tokens * n_out, den)


class HourlyPrice(_Strict):
    """USD per hour of one GPU (`gpus`) or of one CPU node (`cpu_nodes`)."""

    on_demand_per_hour: Decimal = Field(gt=0)
    spot_per_hour: Decimal | None = Field(default=None, gt=0, description="Defaults to spot_fraction x on demand.")


class Capacity(StrEnum):
    ON_DEMAND = "on_demand"
    SPOT = "spot"


class Pool(_Strict):
    """Self-hosted instances serving some models: each on `gpus_per_instance` GPUs of one type, or on one CPU
    node of a type (an ONNX or vLLM CPU worker has the node to itself: its price is the node-hour's)."""

    gpu: str | None = None
    cpu_node: str | None = None
    gpus_per_instance: int = Field(default=1, ge=1)
    capacity: Capacity = Capacity.ON_DEMAND
    models: list[str] = Field(min_length=1)
    worker_ids: list[str] = Field(default_factory=lambda: ["*"], description="Glob patterns of worker ids.")
    # What 1M tokens on this pool are worth when a cache hit avoided them (savings only, never billed).
    reference_per_1m_tokens: Decimal = Field(default=Decimal("0.10"), ge=0)

    @model_validator(mode="after")
    def _one_kind_of_hardware(self) -> Pool:
        if (self.gpu is None) == (self.cpu_node is None):
            raise ValueError("a pool runs on `gpu` (with gpus_per_instance) or on `cpu_node`: exactly one")
        return self

    @property
    def hardware(self) -> str:
        """The priced hardware's name: the GPU type, or the CPU node type."""
        return self.gpu or self.cpu_node or ""


class SelfHostedRate(BaseModel):
    """A pool's resolved price: µUSD per instance-millisecond, overhead included."""

    model_config = ConfigDict(frozen=True)

    pool: str
    gpu: str  # the priced hardware: a GPU type, or a CPU node type
    capacity: Capacity
    usd_per_instance_hour: Decimal
    reference_per_1m_tokens: Decimal

    @cached_property
    def _per_ms(self) -> tuple[int, int]:
        """µUSD per instance-ms as an exact fraction, worked out once (not per interval)."""
        num, den = ratio(self.usd_per_instance_hour)
        return num * 10, den * 36

    def cost_micro(self, instance_ms: int) -> int:
        """instance-ms x USD/hour ÷ 3.6e6 ms/hour x 1e6 µUSD/USD = instance-ms x USD/hour x 10 / 36, rounded once."""
        num, den = self._per_ms
        return div_micro(instance_ms * num, den)


class PriceBook(_Strict):
    version: int = 1
    overhead_factor: Decimal = Field(default=Decimal(1), ge=1, description="Multiplies self-hosted GPU-hours.")
    spot_fraction: Decimal = Field(default=Decimal("0.3"), gt=0, le=1)
    default_model: str = Field(description="The baseline of the savings report: every request to this model.")
    hosted: dict[str, HostedPrice] = Field(default_factory=dict)
    gpus: dict[str, HourlyPrice] = Field(default_factory=dict)
    cpu_nodes: dict[str, HourlyPrice] = Field(default_factory=dict, description="USD per CPU node-hour")
    pools: dict[str, Pool] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> PriceBook:
        for name, pool in self.pools.items():
            if pool.gpu is not None and pool.gpu not in self.gpus:
                raise ValueError(f"pool {name!r}: gpu {pool.gpu!r} has no price under `gpus`")
            if pool.cpu_node is not None and pool.cpu_node not in self.cpu_nodes:
                raise ValueError(f"pool {name!r}: cpu_node {pool.cpu_node!r} has no price under `cpu_nodes`")
            for model in pool.models:
                if model in self.hosted:
                    raise ValueError(f"pool {name!r}: model {model!r} is also priced as hosted")
        if self.default_model not in self.hosted and not any(
            self.default_model in p.models for p in self.pools.values()
        ):
            raise ValueError(f"default_model {self.default_model!r} has no price")
        return self

    def hour_usd(self, price: HourlyPrice, capacity: Capacity) -> Decimal:
        if capacity == Capacity.ON_DEMAND:
            return price.on_demand_per_hour
        return price.spot_per_hour if price.spot_per_hour is not None else price.on_demand_per_hour * self.spot_fraction

    def pool_rate(self, pool_name: str) -> SelfHostedRate:
        pool = self.pools[pool_name]
        if pool.gpu is not None:
            hardware_usd = self.hour_usd(self.gpus[pool.gpu], pool.capacity) * pool.gpus_per_instance
        else:
            hardware_usd = self.hour_usd(self.cpu_nodes[pool.hardware], pool.capacity)
        per_hour = hardware_usd * self.overhead_factor
        return SelfHostedRate(
            pool=pool_name,
            gpu=pool.hardware,
            capacity=pool.capacity,
            usd_per_instance_hour=per_hour,
            reference_per_1m_tokens=pool.reference_per_1m_tokens,
        )

    @cached_property
    def pool_memo(self) -> dict[tuple[str, str | None], str | None]:
        return {}

    def pool_of(self, model: str | None, worker_id: str | None) -> str | None:
        """The first pool that serves `model` on a worker matching its patterns (memoised: glob matching is slow)."""
        if model is None:
            return None
        key = (model, worker_id)
        if key not in self.pool_memo:
            self.pool_memo[key] = next(
                (
                    name
                    for name, pool in self.pools.items()
                    if model in pool.models and any(fnmatch.fnmatchcase(worker_id or "", p) for p in pool.worker_ids)
                ),
                None,
            )
        return self.pool_memo[key]

    def list_price_micro(
        self, model: str | None, prompt_tokens: int, cached: int, completion_tokens: int
    ) -> int | None:
        """What a request costs at list price on `model` (hosted prices, or a pool's reference), for savings."""
        if model is None:
            return None
        if model in self.hosted:
            return self.hosted[model].cost_micro(prompt_tokens, cached, completion_tokens)
        if model not in self.reference_memo:
            pool = self.pool_of(model, None) or next((n for n, p in self.pools.items() if model in p.models), None)
            self.reference_memo[model] = None if pool is None else ratio(self.pools[pool].reference_per_1m_tokens)
        reference = self.reference_memo[model]
        if reference is None:
            return None
        num, den = reference
        return div_micro((prompt_tokens + completion_tokens) * num, den)

    @cached_property
    def reference_memo(self) -> dict[str, tuple[int, int] | None]:
        """Model -> its pool's reference price as an exact fraction (None: not priced), filled on use."""
        return {}


def load_pricebook(path: str | Path | None = None) -> PriceBook:
    return load_yaml(path or DEFAULT_PRICEBOOK_PATH, PriceBook)
