"""How well the router's complexity scorer agrees with a hand-labelled prompt set.

    python -m bench.router_complexity [--scorer heuristic] [--data PATH] [--threshold 0.8]

Reports accuracy, precision / recall of "high" and the confusion matrix at the routing
threshold (the seed's 0.8), ROC AUC (threshold-free), the best-accuracy threshold, and
per-category accuracy, into bench/reports/router_complexity.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from llmbus.contract.messages import ChatMessage, InferenceRequest
from llmbus_services.router.core.complexity import build_scorer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "services" / "router" / "data" / "complexity_labelled.jsonl"
REPORTS = ROOT / "bench" / "reports"


def roc_auc(scores_pos: list[float], scores_neg: list[float]) -> float:
    """Mann-Whitney U / (n_pos * n_neg): the chance a random 'high' outscores a random 'low' (ties count half)."""
    wins = 0.0
    for p in scores_pos:
        for n in scores_neg:
            wins += 1.0 if p > n else 0.5 if p == n else 0.0
    return wins / (len(scores_pos) * len(scores_neg))


def confusion(labels: list[bool], scores: list[float], threshold: float) -> dict[str, int]:
    c = {"tp": 0, "fp": 0, "tn": 0, "fn": 0}
    for is_high, s in zip(labels, scores, strict=True):
        pred = s > threshold
        c[("t" if pred == is_high else "f") + ("p" if pred else "n")] += 1
    return c


def evaluate(rows: list[dict], scores: list[float], threshold: float) -> dict:
    labels = [r["label"] == "high" for r in rows]
    c = confusion(labels, scores, threshold)
    n = len(rows)
    best_t, best_acc = threshold, 0.0
    for t in sorted(set(scores)):
        cc = confusion(labels, scores, t - 1e-9)
        acc = (cc["tp"] + cc["tn"]) / n
        if acc > best_acc:
            best_t, best_acc = t - 1e-9, acc
    per_category: dict[str, dict[str, float]] = {}
    for cat in sorted({r["category"] for r in rows}):
        idx = [i for i, r in enumerate(rows) if r["category"] == cat]
        correct = sum((scores[i] > threshold) == labels[i] for i in idx)
        per_category[cat] = {"n": len(idx), "accuracy": correct / len(idx)}
    pos = [s for s, lab in zip(scores, labels, strict=True) if lab]
    neg = [s for s, lab in zip(scores, labels, strict=True) if not lab]
    return {
        "n": n,
        "n_high": len(pos),
        "n_low": len(neg),
        "threshold": threshold,
        "accuracy": (c["tp"] + c["tn"]) / n,
        "precision_high": c["tp"] / (c["tp"] + c["fp"]) if c["tp"] + c["fp"] else None,
        "recall_high": c["tp"] / (c["tp"] + c["fn"]) if c["tp"] + c["fn"] else None,
        "confusion": c,
        "roc_auc": roc_auc(pos, neg),
        "best_threshold": round(best_t, 4),
        "best_threshold_accuracy": best_acc,
        "per_category": per_category,
    }


def write_plot(rows: list[dict], scores: list[float], threshold: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for label, color in (("low", "tab:blue"), ("high", "tab:red")):
        vals = [s for s, r in zip(scores, rows, strict=True) if r["label"] == label]
        ax.hist(vals, bins=20, range=(0, 1), alpha=0.6, color=color, label=f"labelled {label} (n={len(vals)})")
    ax.axvline(threshold, color="black", linestyle="--", label=f"routing threshold {threshold}")
    ax.set_xlabel("complexity score")
    ax.set_ylabel("prompts")
    ax.legend(fontsize=8)
    ax.set_title("router complexity scorer vs labels")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scorer", default="heuristic")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--out", type=Path, default=REPORTS)
    args = ap.parse_args(argv)

    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    scorer = build_scorer(args.scorer)
    started = time.perf_counter()
    scores: list[float] = []
    for i, row in enumerate(rows, 1):
        request = InferenceRequest(messages=[ChatMessage(role="user", content=row["prompt"])], category=row["category"])
        scores.append(scorer.score(request))
        if i % 20 == 0 or i == len(rows):
            print(f"scored {i}/{len(rows)}", file=sys.stderr)
    elapsed_s = time.perf_counter() - started
    report = evaluate(rows, scores, args.threshold)
    report |= {
        "scorer": args.scorer,
        "data": str(args.data.relative_to(ROOT)) if args.data.is_relative_to(ROOT) else str(args.data),
        "score_us_mean": elapsed_s / len(rows) * 1e6,
        "command": "python -m bench.router_complexity " + " ".join(argv if argv is not None else sys.argv[1:]),
        "misclassified": [
            {"id": r["id"], "label": r["label"], "category": r["category"], "score": round(s, 3)}
            for r, s in zip(rows, scores, strict=True)
            if (s > args.threshold) != (r["label"] == "high")
        ],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "router_complexity.json").write_text(json.dumps(report, indent=2) + "\n")
    write_plot(rows, scores, args.threshold, args.out / "router_complexity.png")
    (args.out / "router_complexity.md").write_text(render_md(report))
    print(render_md(report))
    return 0


def render_md(r: dict) -> str:
    c = r["confusion"]
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [
        "# Router complexity scorer vs labels",
        "",
        f"Command: `{r['command'].strip()}`",
        "",
        f"Scorer `{r['scorer']}` on `{r['data']}`: {r['n']} prompts ({r['n_high']} high, {r['n_low']} low); "
        f"mean {r['score_us_mean']:.0f} µs per score.",
        "",
        f"| metric | value |\n|---|---|\n| accuracy @ {r['threshold']} | {fmt(r['accuracy'])} |\n"
        f"| precision (high) | {fmt(r['precision_high'])} |\n| recall (high) | {fmt(r['recall_high'])} |\n"
        f"| ROC AUC | {fmt(r['roc_auc'])} |\n"
        f"| best threshold (in-sample, for information only) | {r['best_threshold']} → "
        f"{fmt(r['best_threshold_accuracy'])} |",
        "",
        f"Confusion matrix at score > {r['threshold']} (rows: label, columns: prediction):",
        "",
        "| | predicted high | predicted low |\n|---|---|---|",
        f"| labelled high | {c['tp']} | {c['fn']} |",
        f"| labelled low | {c['fp']} | {c['tn']} |",
        "",
        "Per category accuracy:",
        "",
        "| category | n | accuracy |\n|---|---|---|",
        *[f"| {k} | {v['n']} | {v['accuracy']:.2f} |" for k, v in r["per_category"].items()],
        "",
        f"Misclassified ({len(r['misclassified'])}): "
        + ", ".join(f"{m['id']} ({m['label']}, {m['category']}, {m['score']})" for m in r["misclassified"]),
        "",
        "![scores](router_complexity.png)",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
