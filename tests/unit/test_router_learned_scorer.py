"""The learned complexity scorer: shipped model, deterministic training, fallback, feedback labels, promotion rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmbus.contract.messages import (
    ChatMessage,
    Feedback,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
)
from llmbus_services.router.core.complexity import build_scorer, build_scorer_with_fallback
from llmbus_services.router.core.config import load_policy
from llmbus_services.router.core.learned import DEFAULT_MODEL_PATH, ScorerModel, featurize
from llmbus_tools.router_training.corpus import CORPUS_PATH, digest, load_corpus
from llmbus_tools.router_training.feedback import join_samples, label_of
from llmbus_tools.router_training.retrain import is_better
from llmbus_tools.router_training.train import fit, split


def test_shipped_model_is_versioned_against_the_shipped_corpus() -> None:
    model = ScorerModel.load(DEFAULT_MODEL_PATH)
    corpus = load_corpus(CORPUS_PATH)
    assert model.meta["corpus_digest"] == digest(corpus)
    assert model.meta["version"].startswith("lr-" + digest(corpus))
    assert len(corpus) >= 1000 and {r["source"] for r in corpus} == {"hand", "humaneval", "synthetic"}
    # The held-out numbers recorded in the file are the learned model's; it beats chance by far.
    assert model.meta["held_out"]["roc_auc"] > 0.9


def test_learned_scorer_orders_clear_cases_and_stays_in_unit_interval() -> None:
    scorer = build_scorer("learned")
    easy = scorer.score(InferenceRequest(prompt="What is the capital of Portugal?"))
    hard = scorer.score(
        InferenceRequest(
            prompt="Design a sharded rate limiter backed by Redis. Compare token and leaky buckets, prove the refill "
            "rule never exceeds the limit, and explain the failure modes during a failover."
        )
    )
    assert easy < 0.5 < 0.8 < hard
    for text in ["", "x" * 50_000, "prove " * 5000]:
        assert 0.0 <= scorer.score(InferenceRequest(prompt=text)) <= 1.0


def test_conversation_depth_and_category_are_features() -> None:
    msgs = [ChatMessage(role="user", content=f"turn {i}") for i in range(5)]
    feats = featurize(InferenceRequest(messages=msgs, category="quick_edit"))
    assert feats["depth"] == 1.0 and feats["cat:quick_edit"] == 1.0


def test_missing_model_falls_back_to_the_heuristic() -> None:
    scorer = build_scorer_with_fallback("learned", {"model_path": "/nonexistent/model.json"}, "heuristic")
    assert scorer.name == "heuristic"
    with pytest.raises(OSError):
        build_scorer_with_fallback("learned", {"model_path": "/nonexistent/model.json"}, None)
    assert load_policy().scorer.name == "learned" and load_policy().scorer.fallback == "heuristic"


def test_training_is_deterministic_with_a_seed(tmp_path: Path) -> None:
    rows = [r for r in load_corpus() if r["id"].endswith(("0", "5"))]  # a fifth of the corpus keeps it quick
    train_rows, test_rows = split(rows, seed=3)
    assert train_rows and test_rows
    assert not {r["group"] for r in train_rows} & {r["group"] for r in test_rows}
    a, b = fit(train_rows, seed=3, folds=2), fit(train_rows, seed=3, folds=2)
    a.save(tmp_path / "a.json")
    b.save(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert ScorerModel.load(tmp_path / "a.json").weights == a.to_json()["weights"]


def test_feedback_label_rule() -> None:
    assert label_of("small", 0.9) == "low"
    assert label_of("small", 0.1) == "high"
    assert label_of("strong", 0.1) == "high"
    assert label_of("strong", 0.9) is None  # nothing says a cheaper tier would have done
    assert label_of("mid", 0.55) is None


def test_join_keeps_only_ok_same_tenant_non_shadow_samples() -> None:
    policy = load_policy()

    def routed(rid: str, tenant: str = "acme", shadow: bool = False) -> RoutedRequest:
        req = InferenceRequest(request_id=rid, tenant=tenant, prompt=f"prompt {rid}", category="qa")
        return RoutedRequest(request=req, model="qwen2.5-coder-1.5b-instruct", shadow=shadow)

    def result(rid: str, status: ResultStatus = ResultStatus.OK) -> InferenceResult:
        return InferenceResult(request_id=rid, tenant="acme", status=status, model="qwen2.5-coder-1.5b-instruct")

    rs = {rid: routed(rid) for rid in ["good", "bad", "err", "mid"]}
    rs["shadow"] = routed("shadow", shadow=True)
    rs["other"] = routed("other", tenant="globex")
    res = {rid: result(rid) for rid in rs} | {"err": result("err", ResultStatus.ERROR)}
    fb = {rid: Feedback(request_id=rid, tenant="acme", score=0.1) for rid in rs}
    fb["good"] = Feedback(request_id="good", tenant="acme", score=0.9)
    fb["mid"] = Feedback(request_id="mid", tenant="acme", score=0.5)
    rows = join_samples(rs, res, fb.values(), policy)
    assert {(r["id"], r["label"], r["tier"]) for r in rows} == {("good", "low", "small"), ("bad", "high", "small")}
    assert all(r["source"] == "feedback" and r["prompt"].startswith("prompt ") for r in rows)
    json.dumps(rows)  # rows are plain JSON, like the corpus


def test_promotion_rule() -> None:
    def m(auc: float, rh: float, rl: float) -> dict:
        return {"roc_auc": auc, "high": {"recall": rh}, "low": {"recall": rl}}

    assert is_better(m(0.95, 0.9, 0.9), m(0.94, 0.9, 0.9))
    assert not is_better(m(0.95, 0.9, 0.9), m(0.95, 0.9, 0.9))  # the same model is not "better"
    assert not is_better(m(0.99, 0.5, 0.9), m(0.95, 0.9, 0.9))  # a higher AUC bought with recall is refused
