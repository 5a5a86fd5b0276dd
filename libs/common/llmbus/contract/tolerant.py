"""Tolerant reading: a field this reader does not know is dropped (and counted), not refused.

Messages inside the system may gain fields (schemas/README.md: additive-only changes), so a
service reading an internal topic ignores what a newer writer added. Client input (a model with
`STRICT_INPUT`) stays strict: an unknown field there is a typo or an attack, and is refused.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter
from pydantic import ValidationError

from llmbus.contract.messages import Message

UNKNOWN_FIELDS = Counter(
    "llmbus_unknown_fields_total", "Fields a reader did not know and ignored, by schema", ["schema"]
)


def _drop(data: Any, loc: tuple[int | str, ...]) -> bool:
    """Remove the field at `loc` from the parsed JSON `data`; False when the path is not there."""
    *parents, name = loc
    node = data
    for step in parents:
        in_object = isinstance(node, dict) and isinstance(step, str) and step in node
        in_array = isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node)
        if not (in_object or in_array):
            return False
        node = node[step]
    if isinstance(node, dict) and name in node:
        del node[name]
        return True
    return False


def without_unknown_fields(data: dict[str, Any], model: type[Message], exc: ValidationError) -> list[str] | None:
    """The dotted paths of the unknown fields `exc` reports, removed from `data` in place.

    None when the model is strict client input or `exc` names no unknown field (nothing to retry).
    Nested parts are covered too: pydantic reports each unknown field with its full location.
    """
    if model.STRICT_INPUT:
        return None
    dropped = [
        ".".join(str(step) for step in err["loc"])
        for err in exc.errors()
        if err["type"] == "extra_forbidden" and _drop(data, tuple(err["loc"]))
    ]
    if not dropped:
        return None
    UNKNOWN_FIELDS.labels(model.schema_name()).inc(len(dropped))
    return dropped
