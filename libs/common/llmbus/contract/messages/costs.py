"""Cost-accounting's own inputs: the price book as a runtime override."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from llmbus.contract.messages.base import Message, now_ms


class PriceBookUpdate(Message):
    """On llm.pricebook (compacted, key: "pricebook"): the whole price book, as its YAML would say.

    cost-accounting validates it with the same strict model as the file; an invalid book is
    dead-lettered and the current one stays. Workers already running keep the rate they started with.
    """

    book: dict[str, Any]
    updated_by: str = ""
    updated_at_ms: int = Field(default_factory=now_ms)
