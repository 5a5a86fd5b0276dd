"""Which registry version a worker serves (pure): its model's record on llm.models, and the version string.

A worker of a registry model serves one registered version: the one its settings name
(`LLMBUS_WORKER_MODEL_VERSION`), or the model's serving version when they name none. The version
it reports in its heartbeats (and its results) is the registry's, which the scheduler places a
release's requests by. A version the registry does not list, or has retired, is refused: the
worker never reports ready with it. A model outside the registry keeps the version set (default 1).
"""

from __future__ import annotations

from collections.abc import Mapping

from llmbus.contract.messages import ModelSpec, ModelState
from llmbus.domain.registry import by_model

UNREGISTERED_VERSION = "1"


class VersionRefused(ValueError):
    """The worker cannot serve the version asked for: a clear error at start."""


def registry_spec(specs: Mapping[str, ModelSpec], model: str, version: str | None) -> tuple[ModelSpec | None, str]:
    """(the record to serve, its version) from llm.models as read (key → latest record)."""
    known = by_model(specs).get(model)
    if known is None:
        return None, version or UNREGISTERED_VERSION
    listed = ", ".join(sorted(known.versions)) or "none"
    if version is None:
        if known.serving is not None:
            return known.versions.get(known.serving.version, known.serving), known.serving.version
        raise VersionRefused(f"{model} has no serving version yet: set the worker's model version ({listed})")
    record = known.versions.get(version)
    if record is None:
        if known.versions:
            raise VersionRefused(f"{model}@{version} is not in the registry (registered: {listed})")
        return known.serving, version  # a plain model: no versions kept, the worker's word stands
    if record.state == ModelState.RETIRED:
        raise VersionRefused(f"{model}@{version} is retired: it never serves again")
    return record, version
