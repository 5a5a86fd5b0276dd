"""Where a worker learns the artifacts of the model version it serves.

- `model_ref` NAME@VERSION: from the registry, the compacted llm.models read to its end
  (`core.artifacts.artifacts_of` picks the version's record out of the table).
- `artifacts`: given directly, as ModelArtifact JSON (one or a list), or the URI of an artifact's root
  (s3://bucket/prefix/ or file:///dir/) whose manifest `llmbus.artifacts.push_directory` wrote.
"""

from __future__ import annotations

from pydantic import TypeAdapter

from llmbus.artifacts import ObjectStore, read_artifact
from llmbus.bus.tables import read_table
from llmbus.contract import topics as t
from llmbus.contract.messages import ModelSpec
from llmbus.contract.messages.artifacts import ModelArtifact
from llmbus.settings import BusSettings
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.artifacts import artifacts_of

_ONE_OR_MANY: TypeAdapter[ModelArtifact | list[ModelArtifact]] = TypeAdapter(ModelArtifact | list[ModelArtifact])


async def artifacts_to_serve(ws: WorkerSettings, settings: BusSettings) -> list[ModelArtifact]:
    """The artifacts of what this worker serves (ValueError / LookupError saying what is wrong)."""
    if ws.artifacts:
        return given_artifacts(ws.artifacts)
    table = await read_table(settings, t.Topics(settings.topic_prefix).name(t.MODELS), ModelSpec, timeout_s=10)
    return artifacts_of(table, ws.model, ws.model_version)


def given_artifacts(value: str) -> list[ModelArtifact]:
    text = value.strip()
    if text.startswith(("{", "[")):
        found = _ONE_OR_MANY.validate_json(text)
        return found if isinstance(found, list) else [found]
    store = ObjectStore() if text.startswith("s3://") else None
    return [read_artifact(text, store)]
