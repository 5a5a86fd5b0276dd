"""`llmbus models watch NAME`: a model's release followed on llm.models, step by step, until it ends."""

from __future__ import annotations

from collections.abc import Callable

from llmbus.bus import BadMessage, decode
from llmbus.bus.tables import read_table
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import ModelSpec, StateTransition
from llmbus.domain.registry import RegistryError, by_model, version_key
from llmbus.domain.release import ReleaseSummary, history
from llmbus.settings import BusSettings

IN_PROGRESS = "in progress"


async def follow_release(
    settings: BusSettings, name: str, timeout_s: float, show: Callable[[StateTransition], None]
) -> ReleaseSummary:
    """The model's latest release once it has ended, or as it stands after `timeout_s`; `show` gets each of
    its steps once, those taken already first. RegistryError: no such model, or no release of it."""
    topic = t.Topics(settings.topic_prefix).name(t.MODELS)
    tail = await TopicTail(settings, topic).start()  # before the table: no step can fall between the two
    try:
        model = by_model(await read_table(settings, topic, ModelSpec)).get(name)
        if model is None:
            raise RegistryError(f"no model {name!r} on llm.models")
        releases = history(model)
        if not releases:
            raise RegistryError(f"{name}: no release yet (llmbus models release {name}@VERSION)")
        release = releases[-1]
        for change in release.steps:
            show(change)
        if release.outcome != IN_PROGRESS:
            return release
        key = version_key(name, release.version).encode()
        async for record in tail.records(timeout_s):
            if record.key != key or record.value is None:  # type: ignore[attr-defined]
                continue
            try:
                model.versions[release.version] = decode(record, ModelSpec)  # type: ignore[arg-type]
            except BadMessage:
                continue
            steps_before = len(release.steps)
            release = next(r for r in history(model) if r.upgrade_id == release.upgrade_id)
            for change in release.steps[steps_before:]:
                show(change)
            if release.outcome != IN_PROGRESS:
                break
        return release
    finally:
        await tail.stop()
