"""Every data point knows its release: final chunks, cost records and their totals, comparisons, decisions,
pool statistics and scaling decisions, spans and headers, `llmbus trace` and the RLHF export."""

from __future__ import annotations

from llmbus.archive.rlhf import join
from llmbus.bus.headers import UPGRADE_ID, header_value, outgoing
from llmbus.bus.replies import final_chunk
from llmbus.bus.span_attrs import message_attributes
from llmbus.contract import semconv as sc
from llmbus.contract.messages import (
    CostRecord,
    Dispatch,
    InferenceRequest,
    InferenceResult,
    ModelSpec,
    PoolStats,
    RampPlan,
    ReleaseContext,
    ReleaseStage,
    ResultStatus,
    RoutedRequest,
)
from llmbus.domain.lineage import Lineage, render
from llmbus.domain.registry import by_model
from llmbus.domain.release import start
from llmbus_services.autoscaler.core.merge import merge_pool_stats
from llmbus_services.cost_accounting.core.aggregates import batch_increments, dimension_values, increments
from llmbus_services.cost_accounting.core.costing import price_result
from llmbus_services.cost_accounting.core.prices import load_pricebook
from llmbus_services.scheduler.adapters.pool_stats import PoolStatsRecorder
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.scheduler import SchedulerCore
from llmbus_services.shadow_comparator.core.aggregates import PairStats
from llmbus_services.shadow_comparator.core.compare import compare
from llmbus_services.shadow_comparator.core.decide import StepEvidence, decide
from llmbus_services.shadow_comparator.core.samples import not_a_sample
from tests.unit.test_model_registry import apply, registry, version

CANDIDATE = ReleaseContext(
    upgrade_id="upg-9", model_version="2", previous_version="1", stage=ReleaseStage.AB, share_pct=25
)
CONTROL = CANDIDATE.model_copy(update={"model_version": "1"})


def result(rid: str, release: ReleaseContext | None, **kw: object) -> InferenceResult:
    fields: dict[str, object] = dict(
        request_id=rid, tenant="t", status=ResultStatus.OK, model="gpt-4.1-mini", text="a b c", release=release
    )
    return InferenceResult(**(fields | kw))  # type: ignore[arg-type]


def test_the_final_chunk_carries_the_results_release() -> None:
    assert final_chunk(result("r1", CANDIDATE), 3).release == CANDIDATE


def test_cost_records_carry_it_and_add_to_version_and_upgrade_totals() -> None:
    record = price_result(result("r1", CANDIDATE), load_pricebook(None))
    assert isinstance(record, CostRecord) and record.release == CANDIDATE
    dims = dimension_values(record)
    assert dims["version"] == "gpt-4.1-mini@2" and dims["upgrade"] == "upg-9/2"
    assert "version" not in dimension_values(record.model_copy(update={"release": None}))
    control = record.model_copy(update={"release": CONTROL, "record_id": "t:r2"})
    plain = record.model_copy(update={"release": None, "record_id": "t:r3"})
    summed: dict[str, dict[str, int]] = {}
    for key, field_, by in increments(record, "ns:") + increments(control, "ns:") + increments(plain, "ns:"):
        summed.setdefault(key, {}).setdefault(field_, 0)
        summed[key][field_] += by
    assert batch_increments([record, control, plain], "ns:") == summed  # one batch adds what the records add
    upgrade_keys = [k for k in summed if k.endswith(":upgrade")]
    assert upgrade_keys and {f.split("|")[0] for k in upgrade_keys for f in summed[k]} == {"upg-9/2", "upg-9/1"}


def test_spans_and_headers_name_the_release() -> None:
    routed = RoutedRequest(request=InferenceRequest(prompt="x", request_id="r1"), model="m", release=CANDIDATE)
    for value in (routed, Dispatch(routed=routed, worker_id="w"), result("r1", CANDIDATE)):
        attributes = message_attributes(value)
        assert attributes[sc.LLMBUS_UPGRADE_ID] == "upg-9" and attributes[sc.LLMBUS_MODEL_VERSION] == "2"
        assert attributes[sc.LLMBUS_MODEL_PREVIOUS_VERSION] == "1" and attributes[sc.LLMBUS_RELEASE_STAGE] == "ab"
        assert header_value(outgoing(value, "test"), UPGRADE_ID) == "upg-9"
    cost = CostRecord(request_id="r1", tenant="t", model="m", cost_usd=0.0, release=CANDIDATE)
    assert message_attributes(cost)[sc.LLMBUS_RELEASE_SHARE_PCT] == 25
    assert sc.LLMBUS_UPGRADE_ID not in message_attributes(result("r2", None))
    assert header_value(outgoing(result("r2", None), "test"), UPGRADE_ID) is None


def test_trace_prints_the_release_of_the_route_and_the_result() -> None:
    lineage = Lineage("r1")
    request = InferenceRequest(prompt="x", request_id="r1")
    lineage.add(request)
    lineage.add(RoutedRequest(request=request, model="m", release=CANDIDATE))
    lineage.add(result("r1", CANDIDATE))
    lines = [line for line in render(lineage) if "release upg-9" in line]
    assert len(lines) == 2 and all("version 2, previous 1, stage ab 25%" in line for line in lines)


def test_comparisons_and_decisions_carry_the_release() -> None:
    shadow_ctx = CANDIDATE.model_copy(update={"stage": ReleaseStage.SHADOW, "share_pct": 0})
    comparison = compare("upg-9", result("r1", None), result("r1.shadow.upg-9", shadow_ctx, shadow=True))
    assert comparison.release == shadow_ctx
    model = registry(version("1"), version("2"))
    model = apply(model, start(model, "1", by="a").records)
    begun = start(model, "2", by="a", upgrade_id="upg-9")
    assert begun.experiment is not None
    experiment = begun.experiment.model_copy(update={"ramp": RampPlan(min_samples_per_step=1000, min_step_s=0)})
    verdict = decide(experiment, StepEvidence(pairs=PairStats.from_fields({})), now_ms=experiment.step_started_at_ms)
    assert verdict is not None and verdict.decision.release is not None
    assert (verdict.decision.release.upgrade_id, verdict.decision.release.model_version) == ("upg-9", "2")
    assert verdict.decision.release.stage == ReleaseStage.SHADOW


def test_a_result_of_another_version_is_no_sample_of_the_variant() -> None:
    assert not_a_sample(result("r1", CANDIDATE, model_version="2"), "gpt-4.1-mini", "2") is None
    assert not_a_sample(result("r1", CANDIDATE, model_version="1"), "gpt-4.1-mini", "2") == "other_model"


def test_pool_statistics_and_scaling_decisions_carry_the_pools_release() -> None:
    core = SchedulerCore(Pipeline.load("default"))
    serving = ModelSpec(name="m", release=CANDIDATE.model_copy(update={"stage": ReleaseStage.SERVING}))
    core.on_model(serving)
    recorder = PoolStatsRecorder("i1")
    recorder.on_arrival("m", 1000)
    [idle] = recorder.snapshot(core, 2000)
    assert idle.release == serving.release  # no release in progress: the serving version's
    recorder.on_arrival("m", 2100, CONTROL)
    recorder.on_arrival("m", 2200, CANDIDATE)
    recorder.on_arrival("m", 2300, CONTROL)
    [busy] = recorder.snapshot(core, 3000)
    assert busy.release == CANDIDATE  # the release in progress, named by its new version's side
    merged = merge_pool_stats({"i1": [busy]}, {"i1": busy, "i2": busy.model_copy(update={"release": None})})
    assert merged.release == CANDIDATE
    assert isinstance(merged, PoolStats)


def test_the_rlhf_export_carries_the_release() -> None:
    answered = result("r1", CANDIDATE, completed_at_ms=5)
    row = {"tenant": "t", "request_id": "r1", "event_time_ms": 5, "message": answered.model_dump(mode="json")}
    [record] = join([row], [], [], [], labelled_only=False)
    assert record.release == CANDIDATE


def test_version_records_are_grouped_by_model() -> None:
    grouped = by_model(
        {"m": ModelSpec(name="m", version="2"), "m@2": ModelSpec(name="m", version="2", record="version")}
    )
    assert grouped["m"].serving is not None and list(grouped["m"].versions) == ["2"]
