"""llmbus's routing hints at the OpenAI surface: extra body fields, or `x-llmbus-*` headers.

Clients that cannot add body fields (a proxy, a fixed SDK call) send the headers; a body field
wins over its header. They reach the InferenceRequest as its fields of the same names, so the
router's rules (category → editor tier, token budget → mid tier) and the scheduler's session
affinity see them exactly as on the bus.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmbus_services.gateway.core.openai_types import ChatCompletionBody, CompletionBody

# field -> (header, parses the header's text)
HINT_HEADERS: dict[str, tuple[str, type]] = {
    "category": ("x-llmbus-category", str),
    "token_budget": ("x-llmbus-token-budget", int),
    "session_id": ("x-llmbus-session-id", str),
    "priority": ("x-llmbus-priority", int),
    "complexity": ("x-llmbus-complexity", float),
    "adapter": ("x-llmbus-adapter", str),  # a LoRA adapter of `model` (naming the adapter as `model` does the same)
    "migration_limit": ("x-llmbus-migration-limit", int),  # the most legs a cut answer may be continued over
}


class BadHint(ValueError):
    def __init__(self, header: str, message: str) -> None:
        super().__init__(message)
        self.header = header


def routing_hints(body: ChatCompletionBody | CompletionBody, headers: Mapping[str, str]) -> dict[str, object]:
    """The hints set by the body or, failing that, by a header (InferenceRequest validates ranges)."""
    hints: dict[str, object] = {}
    for name, (header, parse) in HINT_HEADERS.items():
        value = getattr(body, name)
        if value is None and (raw := headers.get(header)) is not None and raw.strip():
            try:
                value = parse(raw.strip())
            except ValueError:
                raise BadHint(header, f"header `{header}` must be a {parse.__name__}, not {raw!r}") from None
        if value is not None:
            hints[name] = value
    return hints
