"""Retrain the learned scorer and replace the shipped model only if it is better on held-out data.

    python -m llmbus_tools.router_training.retrain [--from-bus] [--samples FILE.jsonl] [--dry-run] [--force]
    llmbus router retrain ...   (the same)

Data: the shipped corpus (llmbus_tools/router_training/data/complexity_corpus.jsonl), plus production
samples — `--from-bus` joins llm.feedback with llm.routed and llm.results
(training/feedback.py), `--samples` reads rows already in corpus format. The candidate and
the current model are scored on the same held-out groups; the candidate replaces the model
file only when it is better (see `is_better`), unless `--force`. The report is printed as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmbus_services.router.core.learned import DEFAULT_MODEL_PATH, ScorerModel
from llmbus_tools.router_training.corpus import load_corpus
from llmbus_tools.router_training.train import evaluate, heuristic_score, model_score, split, train

MIN_AUC_GAIN = 0.0


def _balanced(metrics: dict[str, Any]) -> float:
    return ((metrics["high"]["recall"] or 0.0) + (metrics["low"]["recall"] or 0.0)) / 2


def is_better(candidate: dict[str, Any], current: dict[str, Any], min_auc_gain: float = MIN_AUC_GAIN) -> bool:
    """Not worse on AUC (by more than nothing) nor on balanced accuracy at the threshold, and better on one."""
    auc_c, auc_o = candidate["roc_auc"], current["roc_auc"]
    bal_c, bal_o = _balanced(candidate), _balanced(current)
    if auc_c < auc_o + min_auc_gain or bal_c < bal_o:
        return False
    return auc_c > auc_o or bal_c > bal_o


def retrain(
    corpus: Sequence[dict], samples: Sequence[dict], current: ScorerModel | None, seed: int = 0
) -> tuple[ScorerModel, dict[str, Any], bool]:
    rows = [*corpus, *samples]
    candidate, report = train(rows, seed)
    _, test_rows = split(rows, seed)
    report["n_feedback_samples"] = len(samples)
    report["current"] = evaluate(test_rows, model_score(current)) if current else None
    report["current_version"] = current.meta.get("version") if current else None
    report["candidate_version"] = candidate.meta["version"]
    better = current is None or is_better(report["learned"], report["current"])
    report["better"] = better
    return candidate, report, better


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEFAULT_MODEL_PATH), help="the model file to compare with and replace")
    ap.add_argument("--samples", action="append", default=[], help="JSONL rows in corpus format (repeatable)")
    ap.add_argument("--from-bus", action="store_true", help="join llm.feedback with llm.routed and llm.results")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="report only, never write")
    ap.add_argument("--force", action="store_true", help="write even when the candidate is not better")
    args = ap.parse_args(argv)

    samples: list[dict] = []
    for path in args.samples:
        samples += [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    if args.from_bus:
        from llmbus.settings import BusSettings
        from llmbus_services.router.config import RouterSettings
        from llmbus_services.router.core.config import load_policy
        from llmbus_tools.router_training.feedback import collect_samples

        policy = load_policy(RouterSettings().policy_path)
        samples += asyncio.run(collect_samples(BusSettings(), policy))
    model_path = Path(args.model)
    current = ScorerModel.load(model_path) if model_path.exists() else None
    candidate, report, better = retrain(load_corpus(), samples, current, args.seed)
    _, test_rows = split([*load_corpus(), *samples], args.seed)
    report["heuristic"] = evaluate(test_rows, heuristic_score)
    write = (better or args.force) and not args.dry_run
    if write:
        candidate.save(model_path)
    report["written"] = write
    print(json.dumps(report, indent=2))
    print(
        f"candidate {candidate.meta['version']}: {'better' if better else 'not better'} than "
        f"{report['current_version']} on {report['n_test']} held-out rows; "
        f"{'written to ' + model_path.name if write else 'model unchanged'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
