"""Where the shared request traces live: `../shared/data/traces` beside the checkout, or $LLMBUS_TRACES."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES_DIR = Path(os.environ.get("LLMBUS_TRACES", REPO.parent / "shared" / "data" / "traces"))
MOONCAKE_CONVERSATION = TRACES_DIR / "mooncake-conversation.jsonl"
AZURE_CONVERSATION = TRACES_DIR / "azure-llm-2023-conv.csv"
