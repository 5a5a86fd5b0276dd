"""Where the request traces live: `data/traces/` in the repository (sources and licences there), or $LLMBUS_TRACES."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES_DIR = Path(os.environ.get("LLMBUS_TRACES", REPO / "data" / "traces"))
MOONCAKE_CONVERSATION = TRACES_DIR / "mooncake-conversation.jsonl"
AZURE_CONVERSATION = TRACES_DIR / "azure-llm-2023-conv.csv"


def shown(path: Path) -> str:
    """A trace's path as a report shows it: relative to the repository (reports hold no machine paths)."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else path.name
