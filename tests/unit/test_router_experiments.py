"""A/B bucketing (sticky, within ±1% of the weights) and shadow selection and copies."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmbus.contract.messages import Experiment, InferenceRequest, RoutedRequest, Variant
from llmbus_services.router.core.experiments import (
    BUCKETS,
    ExperimentBook,
    bucket_of,
    in_shadow,
    pick_variant,
    shadow_copy,
    shadow_request_id,
    unit_of,
)

USERS = [f"user-{i}" for i in range(100_000)]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    weights=st.lists(st.floats(min_value=0.05, max_value=1.0), min_size=2, max_size=4),
    salt=st.text(min_size=0, max_size=12),
)
def test_split_matches_weights_within_one_percent_and_is_sticky(weights: list[float], salt: str) -> None:
    exp = Experiment(
        experiment_id="exp",
        kind="ab",
        salt=salt,
        variants=[Variant(name=f"v{i}", model=f"m{i}", weight=w) for i, w in enumerate(weights)],
    )
    assigned = [pick_variant(exp, u) for u in USERS]
    counts = Counter(a[0] for a in assigned if a)
    total = sum(weights)
    for i, w in enumerate(weights):
        assert abs(counts[f"v{i}"] / len(USERS) - w / total) <= 0.01
    # Sticky: asking again (a new book, a later request) gives every user the same variant.
    again = ExperimentBook()
    again.apply(exp.model_copy())
    replay = again.ab_for("any-model")[0]
    assert all(pick_variant(replay, u) == a for u, a in zip(USERS[:5000], assigned[:5000], strict=True))


def test_salt_reshuffles_users() -> None:
    a = [bucket_of(u, "salt-a") for u in USERS[:2000]]
    b = [bucket_of(u, "salt-b") for u in USERS[:2000]]
    assert sum(x == y for x, y in zip(a, b, strict=True)) < 20
    assert all(0 <= x < BUCKETS for x in a)


def test_unit_is_user_then_session_then_request() -> None:
    assert unit_of(InferenceRequest(prompt="x", user_id="u", session_id="s", request_id="r")) == "u"
    assert unit_of(InferenceRequest(prompt="x", session_id="s", request_id="r")) == "s"
    assert unit_of(InferenceRequest(prompt="x", request_id="r")) == "r"


def test_zero_weight_variant_gets_nobody() -> None:
    exp = Experiment(
        experiment_id="e",
        kind="ab",
        variants=[Variant(name="a", model="m", weight=1), Variant(name="b", model="n", weight=0)],
    )
    assert {pick_variant(exp, u) for u in USERS[:3000]} == {("a", "m")}


def test_shadow_share_is_respected_and_deterministic() -> None:
    exp = Experiment(experiment_id="sh", kind="shadow", salt="s", shadow_model="cand", shadow_share=0.2)
    picked = [in_shadow(exp, u) for u in USERS[:50_000]]
    assert abs(sum(picked) / len(picked) - 0.2) < 0.01
    assert picked == [in_shadow(exp, u) for u in USERS[:50_000]]
    assert not any(in_shadow(exp.model_copy(update={"shadow_share": 0.0}), u) for u in USERS[:1000])
    assert not in_shadow(exp.model_copy(update={"shadow_model": None}), "user-1")


def test_shadow_copy_goes_to_the_experiment_topic_under_a_new_id() -> None:
    request = InferenceRequest(request_id="rid-1", prompt="hi", tenant="acme", reply_topic="llm.tokens.acme")
    routed = RoutedRequest(request=request, model="gpt-4.1-mini", fallback_chain=["x"], cache_group="acme-corp")
    exp = Experiment(
        experiment_id="sh1", kind="shadow", shadow_model="cand", shadow_share=1.0, shadow_reply_topic="llm.shadow"
    )
    copy = shadow_copy(routed, exp)
    assert copy.shadow and copy.model == "cand" and copy.experiment_id == "sh1"
    assert copy.request.request_id == "rid-1.shadow.sh1"
    assert copy.request.reply_topic == "llm.shadow" != request.reply_topic
    assert copy.request.metadata["llmbus.shadow_of"] == "rid-1"
    assert copy.fallback_chain == []
    assert copy.cache_salt == routed.cache_salt  # the tenant's prefix caches: its cache group's, as the primary's
    assert routed.request.reply_topic == "llm.tokens.acme"  # the original is untouched


def test_long_request_ids_still_give_valid_shadow_ids() -> None:
    rid = shadow_request_id("r" * 128, "exp")
    assert len(rid) <= 128 and rid == shadow_request_id("r" * 128, "exp")
    InferenceRequest(request_id=rid, prompt="x")


def test_book_matches_models_and_honours_enabled_and_tombstones() -> None:
    book = ExperimentBook()
    book.apply(
        Experiment(
            experiment_id="a", kind="ab", match_models=["m1"], variants=[Variant(name="x", model="m2", weight=1)]
        )
    )
    book.apply(Experiment(experiment_id="b", kind="shadow", enabled=False, shadow_model="c", shadow_share=1))
    assert [e.experiment_id for e in book.ab_for("m1")] == ["a"]
    assert book.ab_for("m9") == [] and book.shadows_for("m1") == []
    book.apply(None, "a")
    assert book.ab_for("m1") == []


def test_both_readers_keep_the_highest_version_not_the_last_record_or_the_newest_clock() -> None:
    """A stop (version 3) read before a promotion made on version 1 (version 2, a later clock stamp from
    another host): the router and the comparator both keep the stop."""
    from llmbus.contract.messages import ExperimentState
    from llmbus.domain.lifecycle import create, to_step, with_state
    from llmbus_services.shadow_comparator.core.comparator import ExperimentView

    v1 = create("e", "m1", "m2").model_copy(update={"version": 1})
    promoted = to_step(v1, 2).model_copy(update={"version": 2, "updated_at_ms": v1.updated_at_ms + 60_000})
    stopped = with_state(v1, ExperimentState.STOPPED).model_copy(
        update={"version": 3, "updated_at_ms": v1.updated_at_ms + 1}  # this host's clock is behind
    )
    book, view = ExperimentBook(), ExperimentView()
    for record in (v1, stopped, promoted, promoted):  # the older change comes last, and twice
        book.apply(record)
        view.apply(record)
    assert book._by_id["e"].state == ExperimentState.STOPPED and book._by_id["e"].version == 3
    assert not book.ab_for("m1") and not book.shadows_for("m1")
    assert view.by_id["e"].state == ExperimentState.STOPPED
