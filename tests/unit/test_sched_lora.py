"""LoRA adapters in placement: only workers with adapter slots of the rank, the one that has it loaded first
(unless saturated), a free slot before an eviction, and the adapter is part of the prefix-cache key."""

from __future__ import annotations

from llmbus.contract.messages import InferenceRequest, LoraAdapter, RoutedRequest
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.plugins.filters_lora import ServesAdapterFilter
from llmbus_services.scheduler.core.plugins.scorers_lora import AdapterAffinityScorer
from llmbus_services.scheduler.core.types import SchedRequest
from tests.unit.test_sched_filters import NOW_MS, hb, req, run, state_of

SQL = LoraAdapter(name="sql-lora", base_model="m", source="/adapters/sql", rank=8)
CHAT = LoraAdapter(name="chat-lora", base_model="m", source="/adapters/chat", rank=8)


def lora_hb(worker_id: str, loaded: list[str], slots: int = 2, **kw):
    return hb(worker_id, max_loras=slots, max_lora_rank=16, lora_adapters=loaded, **kw)


def test_an_adapter_goes_only_to_workers_with_slots_for_its_rank() -> None:
    state = state_of(lora_hb("a", []), hb("plain"), hb("small", max_loras=1, max_lora_rank=8))
    wide = SQL.model_copy(update={"rank": 16})
    assert run(ServesAdapterFilter(), state, req(adapter=SQL)) == ["a", "small"]
    assert run(ServesAdapterFilter(), state, req(adapter=wide)) == ["a"]
    assert run(ServesAdapterFilter(), state, req()) == ["a", "plain", "small"]  # no adapter: everyone


def test_affinity_prefers_loaded_then_a_free_slot_then_an_eviction() -> None:
    state = state_of(lora_hb("loaded", ["chat-lora", "sql-lora"]), lora_hb("free", ["chat-lora"]))
    state.fleet.on_heartbeat(lora_hb("full", ["chat-lora", "x-lora"]), NOW_MS)
    scores = AdapterAffinityScorer().score(state, req(adapter=SQL), list(state.fleet.workers.values()))
    assert scores == {"loaded": 1.0, "free": 0.5, "full": 0.0}


def test_a_saturated_affinity_worker_scores_as_a_load_elsewhere_would() -> None:
    state = state_of(lora_hb("busy", ["sql-lora"], num_requests_running=8), lora_hb("idle", []))
    scores = AdapterAffinityScorer().score(state, req(adapter=SQL), list(state.fleet.workers.values()))
    assert scores == {"busy": 0.5, "idle": 0.5}
    assert AdapterAffinityScorer(saturated_share=2.0).score(state, req(adapter=SQL), [state.fleet.workers["busy"]]) == {
        "busy": 1.0
    }


def test_a_placement_counts_as_loaded_before_the_next_heartbeat_and_evicts_the_least_recent() -> None:
    state = state_of(lora_hb("a", ["chat-lora"], slots=1), lora_hb("b", []))
    state.fleet.place(req(request_id="r1", adapter=SQL), "a", NOW_MS + 1)
    assert state.fleet.workers["a"].adapters_loaded_est() == ["sql-lora"]  # one slot: chat-lora evicted
    scores = AdapterAffinityScorer().score(state, req(request_id="r2", adapter=SQL), list(state.fleet.workers.values()))
    assert scores == {"a": 1.0, "b": 0.5}
    state.fleet.on_heartbeat(lora_hb("a", ["sql-lora"], slots=1, sent_at_ms=NOW_MS + 5), NOW_MS + 5)
    assert state.fleet.workers["a"].adapters_placed_ms == {}  # the heartbeat speaks for it now


def test_the_default_pipeline_keeps_an_adapter_on_its_worker_and_spills_when_that_one_is_full() -> None:
    pipeline = Pipeline.load("default")
    state = state_of(lora_hb("a", ["sql-lora"], max_num_seqs=2), lora_hb("b", [], max_num_seqs=2))
    picked = []
    for i in range(3):
        request = req(request_id=f"r{i}", adapter=SQL)
        worker = pipeline.pick(state, request).worker
        assert worker is not None
        state.fleet.place(request, worker.worker_id, NOW_MS)
        picked.append(worker.worker_id)
    assert picked == ["a", "a", "b"]  # the third finds a's batch full (fits-capacity) and loads it on b


def test_the_adapter_is_part_of_the_prefix_cache_key_and_the_base_model_is_placed() -> None:
    prompt = "the kafka broker holds the partition offset " * 20
    plain = RoutedRequest(request=InferenceRequest(prompt=prompt), model="m")
    adapted = RoutedRequest(request=InferenceRequest(prompt=prompt), model="sql-lora", adapter=SQL)
    other = RoutedRequest(request=InferenceRequest(prompt=prompt), model="chat-lora", adapter=CHAT)
    a, b, c = (SchedRequest.from_routed(r, NOW_MS) for r in (plain, adapted, other))
    assert a.prefix_block_hashes and b.prefix_block_hashes and c.prefix_block_hashes
    assert not {*a.prefix_block_hashes} & {*b.prefix_block_hashes}
    assert not {*b.prefix_block_hashes} & {*c.prefix_block_hashes}
    assert (a.model, b.model, c.model) == ("m", "m", "m") and b.adapter == SQL
    again = SchedRequest.from_routed(adapted, NOW_MS)
    assert again.prefix_block_hashes == b.prefix_block_hashes
