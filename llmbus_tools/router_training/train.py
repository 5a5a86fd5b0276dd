"""Fit, evaluate and compare complexity scorers (scikit-learn logistic regression, deterministic by seed).

    python -m llmbus_tools.router_training.train [--seed 0] [--out services/router/policies/scorer_model.json]

The split is by `group` (template family, task bucket, hand-set prompt): a group goes to the
held-out set when blake2b(seed:group) falls in the lowest `test_fraction`, so the split is
the same on every run and every machine, and a retrain with more data keeps old held-out
groups held out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmbus_services.router.core.heuristic import HeuristicScorer
from llmbus_services.router.core.learned import DEFAULT_MODEL_PATH, ScorerModel, featurize_text
from llmbus_tools.router_training.corpus import digest, load_corpus

THRESHOLD = 0.8  # the default policy's complexity_high threshold
TIERS = ("high", "low")


def in_test(group: str, seed: int, test_fraction: float) -> bool:
    h = hashlib.blake2b(f"{seed}:{group}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64 < test_fraction


def split(rows: Sequence[dict], seed: int = 0, test_fraction: float = 0.25) -> tuple[list[dict], list[dict]]:
    train = [r for r in rows if not in_test(r["group"], seed, test_fraction)]
    test = [r for r in rows if in_test(r["group"], seed, test_fraction)]
    return train, test


def row_features(row: dict) -> dict[str, float]:
    return featurize_text(row["prompt"], row.get("category"), int(row.get("turns", 1)) - 1, bool(row.get("system")))


def _vectorize(feats: list[dict[str, float]], min_count: int) -> tuple[Any, list[str]]:
    from sklearn.feature_extraction import DictVectorizer

    counts: dict[str, int] = {}
    for f in feats:
        for k in f:
            counts[k] = counts.get(k, 0) + 1
    kept = [{k: v for k, v in f.items() if counts[k] >= min_count} for f in feats]
    vec = DictVectorizer(sort=True)
    x = vec.fit_transform(kept).tocsr()
    # Newer SciPy builds int64 indices, which liblinear refuses; the matrix is small.
    x.indices = x.indices.astype("int32")
    x.indptr = x.indptr.astype("int32")
    return x, [str(n) for n in vec.get_feature_names_out()]


def _fit_lr(rows: Sequence[dict], feats: list[dict[str, float]], seed: int, c: float, min_count: int) -> ScorerModel:
    from sklearn.linear_model import LogisticRegression

    x, names = _vectorize(feats, min_count)
    y = [1 if r["label"] == "high" else 0 for r in rows]
    clf = LogisticRegression(C=c, solver="liblinear", class_weight="balanced", random_state=seed, max_iter=1000)
    clf.fit(x, y)
    weights = {n: float(w) for n, w in zip(names, clf.coef_[0], strict=True) if abs(w) >= 1e-4}
    return ScorerModel(float(clf.intercept_[0]), weights)


def _youden_logit(labels: list[bool], logits: list[float]) -> float:
    """The logit cut that maximises recall(high) + recall(low) (Youden's J)."""
    n_pos = sum(labels) or 1
    n_neg = (len(labels) - sum(labels)) or 1
    best, best_j = 0.0, -1.0
    for cut in sorted(set(logits)):
        tp = sum(lg >= cut and lab for lg, lab in zip(logits, labels, strict=True))
        tn = sum(lg < cut and not lab for lg, lab in zip(logits, labels, strict=True))
        j = tp / n_pos + tn / n_neg
        if j > best_j:
            best, best_j = cut, j
    return best


def fit(
    rows: Sequence[dict],
    seed: int = 0,
    c: float = 1.0,
    min_count: int = 2,
    folds: int = 4,
    threshold: float = THRESHOLD,
) -> ScorerModel:
    """Logistic regression (liblinear, balanced classes) on features seen in at least `min_count` rows.

    Calibration to the policy's threshold: out-of-fold logits (folds by group, inside the
    training rows only) give the cut with the best balanced accuracy; the bias is shifted so
    that this cut maps to `threshold`, i.e. `score > threshold` is the model's "high".
    """
    feats = [row_features(r) for r in rows]
    groups = sorted({r["group"] for r in rows})
    fold_of = {g: i % folds for i, g in enumerate(groups)}
    oof_labels: list[bool] = []
    oof_logits: list[float] = []
    for k in range(folds):
        inner = [i for i, r in enumerate(rows) if fold_of[r["group"]] != k]
        outer = [i for i, r in enumerate(rows) if fold_of[r["group"]] == k]
        part = _fit_lr([rows[i] for i in inner], [feats[i] for i in inner], seed, c, min_count)
        oof_labels += [rows[i]["label"] == "high" for i in outer]
        oof_logits += [part.logit_of(feats[i]) for i in outer]
    model = _fit_lr(rows, feats, seed, c, min_count)
    cut = _youden_logit(oof_labels, oof_logits)
    model.bias += math.log(threshold / (1 - threshold)) - cut
    model.meta["calibration_cut_logit"] = round(cut, 4)
    return model


def roc_auc(labels: Sequence[bool], scores: Sequence[float]) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score([int(x) for x in labels], list(scores)))


def evaluate(rows: Sequence[dict], score: Callable[[dict], float], threshold: float = THRESHOLD) -> dict[str, Any]:
    labels = [r["label"] == "high" for r in rows]
    scores = [score(r) for r in rows]
    out: dict[str, Any] = {"n": len(rows), "threshold": threshold, "roc_auc": round(roc_auc(labels, scores), 4)}
    for tier in TIERS:
        want = tier == "high"
        pred = [(s > threshold) == want for s in scores]
        truth = [lab == want for lab in labels]
        tp = sum(p and t for p, t in zip(pred, truth, strict=True))
        n_pred, n_true = sum(pred), sum(truth)
        out[tier] = {
            "support": n_true,
            "precision": round(tp / n_pred, 4) if n_pred else None,
            "recall": round(tp / n_true, 4) if n_true else None,
        }
    out["accuracy"] = round(sum((s > threshold) == lab for s, lab in zip(scores, labels, strict=True)) / len(rows), 4)
    return out


def heuristic_score(row: dict) -> float:
    from llmbus.contract.messages import InferenceRequest

    scorer = _HEURISTIC
    request = InferenceRequest(prompt=row["prompt"], category=row.get("category"))
    return scorer.score(request)


_HEURISTIC = HeuristicScorer()


def model_score(model: ScorerModel) -> Callable[[dict], float]:
    return lambda row: model.prob_of(row_features(row))


def train(rows: Sequence[dict], seed: int = 0, test_fraction: float = 0.25) -> tuple[ScorerModel, dict[str, Any]]:
    """Fit on the training groups; report held-out metrics of the new model and the heuristic."""
    train_rows, test_rows = split(rows, seed, test_fraction)
    model = fit(train_rows, seed)
    report = {
        "seed": seed,
        "test_fraction": test_fraction,
        "corpus_digest": digest(list(rows)),
        "n_train": len(train_rows),
        "n_test": len(test_rows),
        "learned": evaluate(test_rows, model_score(model)),
        "heuristic": evaluate(test_rows, heuristic_score),
    }
    model.meta |= {
        "version": f"lr-{report['corpus_digest']}-s{seed}",
        "seed": seed,
        "corpus_digest": report["corpus_digest"],
        "n_train": len(train_rows),
        "n_features": len(model.weights),
        "held_out": report["learned"],
    }
    return model, report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(DEFAULT_MODEL_PATH))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    model, report = train(load_corpus(), args.seed)
    model.save(args.out)
    report["fit_s"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(report, indent=2))
    print(f"wrote {Path(args.out).name} ({len(model.weights)} weights, version {model.meta['version']})")


if __name__ == "__main__":
    main()
