"""The model registry's rules (pure): version keys, the state machine of a version, the registry as read.

llm.models holds one record per version (key `<name>@<version>`, `record: version`) and one record
of the model as served (key `<name>`): a copy of the serving version's record, which the router,
scheduler, workers and gateway read. A version moves registered → shadow → canary → serving →
retired; a release that is rolled back (or stopped) sends its candidate back to registered. Every
change is a StateTransition on the record: who, when, why, under which release.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llmbus.contract.messages import ModelSpec, ModelState, ReleaseContext, StateTransition, now_ms

SEPARATOR = "@"

# from → the states it may move to. A canary may move to another share (canary → canary) or back to
# shadow (an operator ramping to 0); registered → serving is a model's first version (nothing to compare).
ALLOWED: dict[ModelState, frozenset[ModelState]] = {
    ModelState.REGISTERED: frozenset({ModelState.SHADOW, ModelState.CANARY, ModelState.SERVING, ModelState.RETIRED}),
    ModelState.SHADOW: frozenset({ModelState.CANARY, ModelState.SERVING, ModelState.REGISTERED}),
    ModelState.CANARY: frozenset({ModelState.CANARY, ModelState.SHADOW, ModelState.SERVING, ModelState.REGISTERED}),
    ModelState.SERVING: frozenset({ModelState.RETIRED}),
    ModelState.RETIRED: frozenset(),
}
IN_RELEASE = frozenset({ModelState.SHADOW, ModelState.CANARY})


class RegistryError(ValueError):
    pass


def version_key(name: str, version: str) -> str:
    return f"{name}{SEPARATOR}{version}"


def parse_ref(ref: str) -> tuple[str, str | None]:
    """`name@version` → (name, version); `name` → (name, None)."""
    name, sep, version = ref.partition(SEPARATOR)
    if not name or (sep and not version):
        raise RegistryError(f"{ref!r} is not NAME or NAME@VERSION")
    return name, version or None


def is_version_key(key: str) -> bool:
    return SEPARATOR in key


def transition(
    record: ModelSpec,
    to_state: ModelState,
    *,
    by: str,
    reason: str = "",
    release: ReleaseContext | None = None,
    at_ms: int | None = None,
) -> ModelSpec:
    """The version record in `to_state`, the change appended to its transitions; RegistryError if not allowed.

    `release`: the release making the change; it becomes the record's `release` too."""
    if record.record != "version" or record.state is None:
        raise RegistryError(f"{record.key}: not a registry version record")
    if to_state not in ALLOWED[record.state]:
        raise RegistryError(f"{record.key}: {record.state.value} → {to_state.value} is not allowed")
    change = StateTransition(
        from_state=record.state,
        to_state=to_state,
        at_ms=at_ms if at_ms is not None else now_ms(),
        by=by,
        reason=reason,
        release=release,
    )
    update: dict[str, object] = {"state": to_state, "transitions": [*record.transitions, change]}
    if release is not None:
        update["release"] = release
    return record.model_copy(update=update)


def registered(record: ModelSpec, *, by: str, reason: str = "", at_ms: int | None = None) -> ModelSpec:
    """A new version's record, in state registered with its first transition."""
    at = at_ms if at_ms is not None else now_ms()
    first = StateTransition(to_state=ModelState.REGISTERED, at_ms=at, by=by, reason=reason)
    return record.model_copy(
        update={
            "record": "version",
            "state": ModelState.REGISTERED,
            "transitions": [first],
            "registered_at_ms": at,
            "release": None,
        }
    )


def serving_record(version: ModelSpec) -> ModelSpec:
    """The model-as-served record (key: the name) copied from its serving version's record."""
    return version.model_copy(update={"record": "serving"})


@dataclass
class ModelVersions:
    """One model's records: its versions by version string, and the record it is served by (if any)."""

    name: str
    versions: dict[str, ModelSpec] = field(default_factory=dict)
    serving: ModelSpec | None = None

    def in_release(self) -> list[ModelSpec]:
        return [v for v in self.versions.values() if v.state in IN_RELEASE]

    def ordered(self) -> list[ModelSpec]:
        """Versions in the order they were registered."""
        return sorted(self.versions.values(), key=lambda v: (v.registered_at_ms or 0, v.version))


def by_model(records: Mapping[str, ModelSpec]) -> dict[str, ModelVersions]:
    """llm.models as read (key → latest record) grouped by model name."""
    out: dict[str, ModelVersions] = {}
    for key, spec in records.items():
        entry = out.setdefault(spec.name, ModelVersions(spec.name))
        if is_version_key(key) or spec.record == "version":
            entry.versions[spec.version] = spec
        else:
            entry.serving = spec
    return out
