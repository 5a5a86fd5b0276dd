"""The router resolves LoRA adapters: `model` = an adapter, or a base model with `adapter`, routes to the adapter
with its record on the routed request; an unknown adapter or another base's is refused; an A/B or shadow
experiment of an adapter against its base carries the adapter on exactly the copies that run it."""

from __future__ import annotations

from llmbus.contract.messages import (
    ErrorCode,
    Experiment,
    InferenceRequest,
    LoraAdapter,
    ModelSpec,
    RoutedRequest,
    Variant,
)
from llmbus.domain.fallback import fall_back
from llmbus_services.router.core.complexity import build_scorer
from llmbus_services.router.core.config import load_policy
from llmbus_services.router.core.experiments import ExperimentBook
from llmbus_services.router.core.pipeline import RouterCore

SQL = LoraAdapter(name="tiny-sql", base_model="tiny", source="/adapters/sql", rank=8)


def core(experiments: ExperimentBook | None = None) -> RouterCore:
    c = RouterCore(load_policy(), build_scorer("heuristic"), experiments=experiments)
    c.catalog.apply_spec(ModelSpec(name="tiny", tier="small", max_model_len=512, max_output_tokens=64))
    c.catalog.apply_spec(ModelSpec(name="tiny-sql", tier="small", max_model_len=512, max_output_tokens=64, lora=SQL))
    return c


async def test_naming_the_adapter_as_the_model_routes_to_it_with_its_record() -> None:
    out = await core().route(InferenceRequest(prompt="select", model="tiny-sql", max_tokens=8))
    assert out.routed is not None
    assert out.routed.model == "tiny-sql" and out.routed.adapter == SQL and out.routed.placement_model == "tiny"
    plain = await core().route(InferenceRequest(prompt="select", model="tiny", max_tokens=8))
    assert plain.routed is not None and plain.routed.adapter is None and plain.routed.placement_model == "tiny"


async def test_a_base_with_an_adapter_is_the_same_request_as_the_adapter() -> None:
    out = await core().route(InferenceRequest(prompt="select", model="tiny", adapter="tiny-sql", max_tokens=8))
    assert out.routed is not None and out.routed.model == "tiny-sql" and out.routed.adapter == SQL


async def test_an_unknown_adapter_or_one_of_another_base_is_refused() -> None:
    unknown = await core().route(InferenceRequest(prompt="select", model="tiny", adapter="nope", max_tokens=8))
    assert unknown.result is not None and unknown.result.error is not None
    assert unknown.result.error.code == ErrorCode.MODEL_UNAVAILABLE and "'nope' is not in the catalog" in (
        unknown.result.error.message
    )
    other = await core().route(InferenceRequest(prompt="select", model="gpt-4.1", adapter="tiny-sql", max_tokens=8))
    assert (
        other.result is not None
        and other.result.error is not None
        and "of 'tiny', not of 'gpt-4.1'" in (other.result.error.message)
    )


async def test_an_ab_of_an_adapter_against_its_base_carries_the_adapter_on_its_variant_only() -> None:
    book = ExperimentBook()
    book.apply(
        Experiment(
            experiment_id="sql-vs-base",
            kind="ab",
            match_models=["tiny"],
            variants=[Variant(name="base", model="tiny", weight=1), Variant(name="sql", model="tiny-sql", weight=1)],
        )
    )
    c = core(book)
    seen = {}
    for i in range(40):
        out = await c.route(InferenceRequest(prompt="select", model="tiny", user_id=f"u{i}", max_tokens=8))
        assert out.routed is not None
        seen[out.routed.variant] = (out.routed.model, out.routed.adapter)
    assert seen == {"base": ("tiny", None), "sql": ("tiny-sql", SQL)}


def test_falling_back_from_an_adapter_leaves_it_behind_and_back_to_one_picks_it_up() -> None:
    specs = {"tiny": ModelSpec(name="tiny"), "tiny-sql": ModelSpec(name="tiny-sql", lora=SQL)}
    first = RoutedRequest(request=InferenceRequest(prompt="x"), model="tiny-sql", adapter=SQL, fallback_chain=["tiny"])
    moved = fall_back(first, "tiny-sql", ErrorCode.MODEL_UNAVAILABLE, specs=specs)
    assert moved is not None and moved.model == "tiny" and moved.adapter is None
    back = RoutedRequest(request=InferenceRequest(prompt="x"), model="tiny", fallback_chain=["tiny-sql"])
    onto = fall_back(back, "tiny", ErrorCode.MODEL_UNAVAILABLE, specs=specs)
    assert onto is not None and onto.adapter == SQL
