"""Scorers rate in [0, 1] the way their names say; pickers pick the best or in turn."""

from __future__ import annotations

import random

import pytest

from llmbus.contract.request_key import request_key
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.plugins.pickers import MaxScorePicker, RoundRobinPicker
from llmbus_services.scheduler.core.plugins.scorers_affinity import PrefixAffinityScorer, SessionAffinityScorer
from llmbus_services.scheduler.core.plugins.scorers_load import KvUsageScorer, QueueDepthScorer
from tests.unit.test_sched_filters import NOW_MS, hb, req, state_of


def workers(state):
    return list(state.fleet.workers.values())


def test_queue_depth_scores_own_placements_min_max() -> None:
    state = state_of(hb("a"), hb("b"), hb("c"))
    for i in range(4):
        state.fleet.place(req(request_id=f"a{i}"), "a", NOW_MS)
    for i in range(2):
        state.fleet.place(req(request_id=f"b{i}"), "b", NOW_MS)
    assert QueueDepthScorer().score(state, req(), workers(state)) == {"a": 0.0, "b": 0.5, "c": 1.0}


def test_queue_depth_trusts_heartbeat_when_it_sees_more() -> None:
    state = state_of(hb("a", num_requests_running=3, num_requests_waiting=3), hb("b"))
    assert QueueDepthScorer().score(state, req(), workers(state)) == {"a": 0.0, "b": 1.0}


def test_equal_load_scores_all_one() -> None:
    state = state_of(hb("a"), hb("b"))
    assert QueueDepthScorer().score(state, req(), workers(state)) == {"a": 1.0, "b": 1.0}


def test_kv_usage_prefers_free_cache() -> None:
    state = state_of(hb("a", kv_blocks_free=250), hb("b", kv_blocks_free=1000), hb("c", kv_blocks_total=0))
    assert KvUsageScorer().score(state, req(), workers(state)) == {"a": 0.25, "b": 1.0, "c": 0.5}


def test_prefix_affinity_is_the_share_of_leading_blocks_held() -> None:
    state = state_of(hb("a"), hb("b"), hb("c"))
    state.prefix_index.record("a", ["h1", "h2", "h3"], NOW_MS)
    state.prefix_index.record("b", ["h1"], NOW_MS)
    scores = PrefixAffinityScorer().score(state, req(prefix_block_hashes=["h1", "h2", "h3", "h4"]), workers(state))
    assert scores == {"a": 0.75, "b": 0.25, "c": 0.0}


def test_session_affinity_prefers_the_last_worker_of_the_session() -> None:
    state = state_of(hb("a"), hb("b"))
    state.sessions.record("s1", "b")
    assert SessionAffinityScorer().score(state, req(session_id="s1"), workers(state)) == {"a": 0.0, "b": 1.0}
    assert SessionAffinityScorer().score(state, req(session_id="s2"), workers(state)) == {"a": 0.0, "b": 0.0}


def test_max_score_picker_takes_the_best_and_breaks_ties_with_the_seeded_rng() -> None:
    state = state_of(hb("a"), hb("b"), hb("c"))
    a, b, c = (state.fleet.workers[x] for x in "abc")
    assert MaxScorePicker().pick(state, req(), [(a, 0.2), (b, 0.9), (c, 0.5)]).worker_id == "b"
    picks = set()
    for seed in range(20):
        state.rng = random.Random(seed)
        picks.add(MaxScorePicker().pick(state, req(), [(a, 0.9), (b, 0.9), (c, 0.1)]).worker_id)
    assert picks == {"a", "b"}
    state.rng = random.Random(7)
    first = MaxScorePicker().pick(state, req(), [(a, 0.9), (b, 0.9)]).worker_id
    state.rng = random.Random(7)
    assert MaxScorePicker().pick(state, req(), [(a, 0.9), (b, 0.9)]).worker_id == first


def test_round_robin_picker_cycles_per_model() -> None:
    state = state_of(hb("b"), hb("a"), hb("c"))
    picker = RoundRobinPicker()
    scored = [(w, 0.0) for w in workers(state)]
    assert [picker.pick(state, req(), scored).worker_id for _ in range(4)] == ["a", "b", "c", "a"]
    assert picker.pick(state, req(model="other"), scored).worker_id == "a"


def test_default_pipeline_weighs_prefix_against_load() -> None:
    pipeline = Pipeline.load("default")
    state = state_of(hb("a"), hb("b"))
    hashes = [f"h{i}" for i in range(10)]
    state.prefix_index.record("a", hashes, NOW_MS)
    # a holds the whole prefix: it wins although b is idle and a has one request.
    state.fleet.place(req(request_id="x"), "a", NOW_MS)
    assert pipeline.pick(state, req(prefix_block_hashes=hashes)).worker.worker_id == "a"
    # Without a shared prefix, load decides.
    assert pipeline.pick(state, req(prefix_block_hashes=["z1", "z2"])).worker.worker_id == "b"


def pipeline_with(**changes: object) -> dict[str, object]:
    return {"name": "p", "filters": [{"type": "serves-model"}], "scorers": [{"type": "kv-usage"}]} | changes


def test_unknown_plugin_and_negative_weight_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown scorer"):
        Pipeline.from_dict(pipeline_with(scorers=[{"type": "nope"}]))
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        Pipeline.from_dict(pipeline_with(scorers=[{"type": "kv-usage", "weight": -1}]))


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        # `filter:` for `filters:` used to load as a pipeline with no filters: any worker, any model.
        ({"filter": [{"type": "serves-model"}], "filters": None}, "filter"),
        ({"filters": [{"type": "gpu-healthy"}]}, "must include 'serves-model'"),
        ({"filters": [{"type": "serves-model", "params": {"strict_exclud": True}}]}, "unknown params"),
        (
            {"filters": [{"type": "serves-model"}, {"type": "fits-capacity", "params": {"kv_headroom": "1"}}]},
            "kv_headroom",
        ),
        ({"scorers": [{"type": "kv-usage", "wieght": 2}]}, "wieght"),
        ({"picker": {"type": "max-score", "param": {}}}, "param"),
    ],
)
def test_a_pipeline_file_with_a_mistake_is_refused_at_load(broken: dict[str, object], reason: str) -> None:
    cfg = {k: v for k, v in (pipeline_with() | broken).items() if v is not None}
    with pytest.raises(ValueError, match=reason):
        Pipeline.from_dict(cfg)


def test_prefill_backlog_prefers_the_shorter_wait_counting_prefix_hits() -> None:
    from llmbus_services.scheduler.core.plugins.scorers_load import PrefillBacklogScorer

    state = state_of(hb("a"), hb("b"), hb("c"))
    state.fleet.prefill_tokens_per_ms = 10.0
    state.fleet.place(req(5000, 1, request_id="x"), "a", NOW_MS)  # 5000 tokens queued on a
    state.fleet.place(req(1000, 1, request_id="y"), "b", NOW_MS)
    scorer = PrefillBacklogScorer()
    assert scorer.score(state, req(100, 1), workers(state)) == {"a": 0.0, "b": 0.8, "c": 1.0}
    # 300 ms later a has drained 3000 tokens, b all of its 1000.
    state.now_ms = NOW_MS + 300
    assert state.fleet.workers["a"].prefill_backlog_at(state.now_ms, 10.0) == 2000
    # c must compute the whole 3200-token prompt, b holds 3200 of it: b wins although c is idle.
    hashes = [f"h{i}" for i in range(200)]
    state.prefix_index.record("b", hashes, state.now_ms)
    scores = scorer.score(state, req(3200, 1, request_id="z", prefix_block_hashes=hashes), workers(state))
    assert scores["b"] == 1.0 and scores["a"] == 0.0 and 0 < scores["c"] < 1


def test_every_shipped_pipeline_loads() -> None:
    from llmbus_services.scheduler.core.pipeline import PIPELINES_DIR

    names = sorted(p.stem for p in PIPELINES_DIR.glob("*.yaml"))
    assert {"default", "least-loaded", "round-robin"} <= set(names)
    for name in names:
        assert Pipeline.load(name).name == name


def test_prefill_backlog_estimate_is_corrected_by_outcomes_and_idle_heartbeats() -> None:
    state = state_of(hb("a"))
    fleet = state.fleet
    fleet.prefill_tokens_per_ms = 1.0  # deliberately far too slow
    fleet.place(req(50_000, 1, request_id="big"), "a", NOW_MS)
    fleet.place(req(3_000, 1, request_id="small"), "a", NOW_MS)
    view = fleet.workers["a"]
    assert view.prefill_backlog_at(NOW_MS + 1000, 1.0) == 52_000
    fleet.finish(request_key("default", "big"), 1, NOW_MS + 1000)  # it finished, so its prefill is certainly done
    assert view.prefill_backlog_at(NOW_MS + 1000, 1.0) == 3_000
    # A heartbeat from an idle engine: nothing placed before it can still be queued.
    fleet.finish(request_key("default", "small"), 1, NOW_MS + 1000)
    fleet.place(req(20_000, 1, request_id="x"), "a", NOW_MS + 1000)
    fleet.on_heartbeat(hb("a", num_requests_running=1, sent_at_ms=NOW_MS + 1500), NOW_MS + 1500)  # x runs
    assert view.prefill_backlog_at(NOW_MS + 1500, 1.0) == 20_000 - 500
    fleet.finish(request_key("default", "x"), 1, NOW_MS + 1600)
    fleet.place(req(7_000, 1, request_id="z"), "a", NOW_MS + 1700)  # placed after the next heartbeat was sent
    view.prefill_backlog_tokens += 40_000  # a wrong estimate ...
    fleet.on_heartbeat(hb("a", num_requests_running=0, sent_at_ms=NOW_MS + 1650), NOW_MS + 2000)
    assert view.prefill_backlog_at(NOW_MS + 2000, 1.0) == 7_000  # ... corrected by an idle heartbeat
    # The worker's reported prompt throughput drains the estimate when it is faster than configured.
    fleet.place(req(30_000, 1, request_id="y"), "a", NOW_MS + 2000)
    fleet.on_heartbeat(
        hb("a", num_requests_waiting=3, prompt_tokens_per_s=100_000.0, sent_at_ms=NOW_MS + 2000), NOW_MS + 2000
    )
    assert view.prefill_backlog_at(NOW_MS + 2100, 1.0) < view.prefill_backlog_at(NOW_MS + 2000, 1.0) - 9_000
