"""Each scheduler filter keeps exactly the workers it should."""

from __future__ import annotations

from llmbus.contract.messages import GpuInfo, ModelFormat, ModelSpec, NodeProfile, WorkerState, WorkerStatus
from llmbus_services.scheduler.core.fleet import FleetView
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.plugins import CycleState
from llmbus_services.scheduler.core.plugins.filters_health import FitsCapacityFilter, GpuHealthyFilter
from llmbus_services.scheduler.core.plugins.filters_model import (
    EngineSupportsFilter,
    FormatSupportedFilter,
    ServesModelFilter,
)
from llmbus_services.scheduler.core.prefix_index import PrefixIndex, SessionIndex
from llmbus_services.scheduler.core.types import SchedRequest

NOW_MS = 1_000_000


def hb(worker_id: str, **kw) -> WorkerStatus:
    fields = dict(
        worker_id=worker_id,
        node_id=f"node-{worker_id}",
        state=WorkerState.READY,
        engine="sim",
        models=["m"],
        max_model_len=8192,
        max_num_seqs=8,
        kv_blocks_total=1000,
        kv_blocks_free=1000,
        sent_at_ms=NOW_MS,
        started_at_ms=NOW_MS - 60_000,  # one process throughout: a later start is the id restarted
    )
    fields.update(kw)
    return WorkerStatus(**fields)


def state_of(*statuses: WorkerStatus, specs: dict[str, ModelSpec] | None = None) -> CycleState:
    fleet = FleetView()
    for s in statuses:
        fleet.on_heartbeat(s, NOW_MS)
    return CycleState(NOW_MS, fleet, PrefixIndex(), SessionIndex(), specs or {})


def req(prompt_tokens: int = 100, max_tokens: int = 100, **kw) -> SchedRequest:
    return SchedRequest(
        request_id=kw.pop("request_id", "r1"),
        model=kw.pop("model", "m"),
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        **kw,
    )


def ids(workers) -> list[str]:
    return sorted(w.worker_id for w in workers)


def run(flt, state: CycleState, request: SchedRequest) -> list[str]:
    return ids(flt.filter(state, request, list(state.fleet.workers.values())))


def test_serves_model_keeps_only_ready_workers_of_the_model() -> None:
    state = state_of(
        hb("a"),
        hb("b", models=["other"]),
        hb("c", state=WorkerState.DRAINING),
        hb("d", state=WorkerState.WARMING),
        hb("e"),
    )
    assert run(ServesModelFilter(), state, req()) == ["a", "e"]


def test_serves_model_avoids_workers_that_failed_the_request_unless_none_else() -> None:
    state = state_of(hb("a"), hb("b"))
    assert run(ServesModelFilter(), state, req(excluded_workers={"a"})) == ["b"]
    assert run(ServesModelFilter(), state, req(excluded_workers={"a", "b"})) == ["a", "b"]
    assert run(ServesModelFilter(strict_exclude=True), state, req(excluded_workers={"a", "b"})) == []


def test_gpu_healthy_drops_unhealthy_and_ecc_over_threshold() -> None:
    state = state_of(
        hb("ok"),
        hb("sick", gpu_healthy=False),
        hb("ecc1", ecc_uncorrected=1),
        hb("ecc5", ecc_uncorrected=5),
        hb("bad", state=WorkerState.UNHEALTHY),
    )
    assert run(GpuHealthyFilter(), state, req()) == ["ok"]
    assert run(GpuHealthyFilter(max_ecc_uncorrected=2), state, req()) == ["ecc1", "ok"]


def test_fits_capacity_checks_model_length_free_kv_and_batch() -> None:
    state = state_of(hb("short", max_model_len=1000), hb("full", kv_blocks_free=10), hb("roomy"))
    # 900 + 200 tokens = 1100 > 1000; needs ceil(1100/16) = 69 blocks > 10 free
    assert run(FitsCapacityFilter(), state, req(900, 200)) == ["roomy"]
    assert run(FitsCapacityFilter(), state, req(100, 60)) == ["full", "roomy", "short"]  # 10 blocks fit exactly
    assert run(FitsCapacityFilter(), state, req(100, 61)) == ["roomy", "short"]  # 11 blocks do not


def test_fits_capacity_subtracts_what_was_placed_since_the_heartbeat() -> None:
    state = state_of(hb("a", kv_blocks_free=100))
    state.fleet.place(req(16 * 60, 0, request_id="x"), "a", NOW_MS + 1)  # 60 blocks placed after the heartbeat
    assert state.fleet.workers["a"].kv_blocks_free_est == 40
    assert run(FitsCapacityFilter(), state, req(16 * 40, 0)) == ["a"]
    assert run(FitsCapacityFilter(), state, req(16 * 41, 0)) == []
    # A newer heartbeat already counts that request: the estimate is the heartbeat's alone.
    state.fleet.on_heartbeat(hb("a", kv_blocks_free=30, sent_at_ms=NOW_MS + 5), NOW_MS + 5)
    assert state.fleet.workers["a"].kv_blocks_free_est == 30


def test_fits_capacity_respects_max_num_seqs() -> None:
    state = state_of(hb("a", max_num_seqs=2))
    for i in range(2):
        state.fleet.place(req(request_id=f"x{i}"), "a", NOW_MS)
    assert run(FitsCapacityFilter(), state, req()) == []
    assert run(FitsCapacityFilter(check_batch=False), state, req()) == ["a"]


def test_format_supported_uses_worker_list_and_compute_capability() -> None:
    spec = ModelSpec(
        name="m",
        formats=[
            ModelFormat(name="fp8", weight_bytes=1, min_compute_capability="8.9"),
            ModelFormat(name="bf16", weight_bytes=2, min_compute_capability="8.0"),
        ],
    )
    state = state_of(
        hb("h100", model_format="fp8", formats_supported=["fp8", "bf16"]),
        hb("a100", model_format="fp8"),
        hb("a100bf", model_format="bf16"),
        hb("nolist", model_format="awq", formats_supported=["bf16"]),
        specs={"m": spec},
    )
    for node, cc in (("node-h100", "9.0"), ("node-a100", "8.0"), ("node-a100bf", "8.0")):
        state.fleet.on_node(
            NodeProfile(
                node_id=node,
                hostname=node,
                kind="gpu",
                gpus=[
                    GpuInfo(
                        index=0, name="gpu", uuid=node, memory_total_bytes=1, memory_free_bytes=1, compute_capability=cc
                    )
                ],
            )
        )
    assert run(FormatSupportedFilter(), state, req()) == ["a100bf", "h100"]


def test_engine_supports_prefers_engines_that_honour_the_request() -> None:
    state = state_of(hb("sim"), hb("gpu", engine="vllm"), hb("hosted", engine="openai-http"))
    json_mode = frozenset({"response_format"})
    assert run(EngineSupportsFilter(), state, req(engine_features=json_mode)) == ["gpu", "hosted"]
    assert run(EngineSupportsFilter(), state, req(engine_features=frozenset({"tools"}))) == ["gpu", "hosted"]
    assert run(EngineSupportsFilter(), state, req(engine_features=frozenset({"suffix"}))) == ["hosted", "sim"]
    assert run(EngineSupportsFilter(), state, req()) == ["gpu", "hosted", "sim"]  # plain text: any
    sims = state_of(hb("sim-1"), hb("sim-2"))
    # Nobody can: all stay, and the worker's clear refusal ends the request instead of a long wait.
    assert run(EngineSupportsFilter(), sims, req(engine_features=json_mode)) == ["sim-1", "sim-2"]
    picked = Pipeline.load("default").pick(state, req(engine_features=json_mode)).worker
    assert picked is not None and picked.worker_id in ("gpu", "hosted")


def test_a_vllm_worker_with_a_fim_format_takes_a_suffix_by_its_heartbeat() -> None:
    fim = ["response_format", "suffix", "tools"]
    state = state_of(hb("plain", engine="vllm"), hb("coder", engine="vllm", engine_features=fim))
    assert run(EngineSupportsFilter(), state, req(engine_features=frozenset({"suffix"}))) == ["coder"]
    assert run(EngineSupportsFilter(), state, req(engine_features=frozenset({"tools"}))) == ["coder", "plain"]


def test_pipeline_reports_the_filter_that_emptied_the_candidates() -> None:
    state = state_of(hb("a", kv_blocks_free=1))
    result = Pipeline.load("default").pick(state, req(1000, 1000))
    assert result.worker is None and result.rejected_by == "fits-capacity"


def test_an_unset_max_tokens_fits_a_worker_whose_window_leaves_the_prompt_room() -> None:
    """The client set no max_tokens: the router's 16,384-token cap is over a worker's 8,192 window, and
    the worker bounds the answer to what its window leaves, so it fits (vllm serve's rule); a set one does not."""
    from llmbus_services.scheduler.core.plugins.filters_health import never_fits

    state = state_of(hb("narrow", max_model_len=8192, kv_blocks_total=600, kv_blocks_free=600))
    auto = req(prompt_tokens=11, max_tokens=16_384, max_tokens_auto=True)
    assert auto.tokens_on(8192) == 8192 and auto.tokens_on(0) == auto.total_tokens
    assert run(FitsCapacityFilter(), state, auto) == ["narrow"]
    assert not never_fits(auto, list(state.fleet.workers.values()))
    asked = req(prompt_tokens=11, max_tokens=16_384)
    assert run(FitsCapacityFilter(), state, asked) == [] and never_fits(asked, list(state.fleet.workers.values()))
    # a prompt that fills the window leaves no room even for one token
    full = req(prompt_tokens=8192, max_tokens=16_384, max_tokens_auto=True)
    assert never_fits(full, list(state.fleet.workers.values()))
