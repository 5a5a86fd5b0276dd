"""The model catalog: YAML entries, overridden at runtime by ModelSpec records from llm.models.

Only the records of models as served count (key: the name); the registry's per-version records
(key `name@version`) are the CLI's and the releases' business. A registry model's serving record
names its version and release: requests to it carry that release (and so run on that version)
unless a release in progress routes them.
"""

from __future__ import annotations

from collections.abc import Callable

from llmbus.contract.messages import InferenceRequest, LoraAdapter, ModelSpec, ModelState, ReleaseContext
from llmbus.domain.adapters import lora_adapter_of
from llmbus.tokens import estimate_tokens, try_load
from llmbus_services.router.core.config import ModelEntry, RouterPolicy


class ModelCatalog:
    def __init__(self, policy: RouterPolicy) -> None:
        self._entries: dict[str, ModelEntry] = dict(policy.models)
        self._unknown = policy.limits.unknown_model_defaults
        # Models marked unavailable (e.g. a tombstone on llm.models, or an operator drain):
        # routing walks the fallback chain past them.
        self._unavailable: set[str] = set()
        self.adapters: dict[str, LoraAdapter] = {}  # served name → the LoRA adapter it is (llm.models records)
        self._releases: dict[str, ReleaseContext] = {}  # registry models: the release their serving version is of
        # LoRA adapters of registry versions, by (name, version): a release routes to its version's adapter.
        self._adapter_versions: dict[tuple[str, str], LoraAdapter] = {}

    def knows(self, model: str) -> bool:
        return model in self._entries

    def entry(self, model: str) -> ModelEntry:
        return self._entries.get(model, self._unknown)

    def max_prompt_tokens(self, model: str) -> int:
        entry = self.entry(model)
        return entry.max_prompt_tokens or entry.max_model_len - 1

    def counter(self, model: str) -> tuple[Callable[[str], int], str | None]:
        """How to count the model's prompt tokens, and the tokenizer reference that counts (None: the estimate)."""
        ref = self.entry(model).tokenizer
        tokenizer = try_load(ref)
        return (tokenizer.count, ref) if tokenizer is not None else (estimate_tokens, None)

    def adapter_of(self, model: str, release: ReleaseContext | None = None) -> LoraAdapter | None:
        """The LoRA adapter `model` names (under `release`: its version's), or None for a plain model."""
        if release is not None and (versioned := self._adapter_versions.get((model, release.model_version))):
            return versioned
        return self.adapters.get(model)

    def template_tokens(self, model: str, request: InferenceRequest, count: Callable[[str], int]) -> int:
        """What the model reads of a chat beyond its turns: the chat template's own text and, with tools,
        the tool definitions and the template's instructions around them (0 for a plain prompt)."""
        if request.prompt is not None:
            return 0
        entry = self.entry(model)
        tools = count(request.tools_text()) + entry.tools_template_tokens if request.tools else 0
        return entry.chat_template_tokens + tools

    def is_available(self, model: str) -> bool:
        return model not in self._unavailable

    def set_available(self, model: str, available: bool) -> None:
        (self._unavailable.discard if available else self._unavailable.add)(model)

    def release_of(self, model: str) -> ReleaseContext | None:
        """The serving version's release context of a registry model (None: not in the registry's lifecycle)."""
        return self._releases.get(model)

    def apply_spec(self, spec: ModelSpec) -> None:
        """A ModelSpec wins over the YAML for the limits it carries; tier and cost rank stay if it has none."""
        if spec.record != "serving":  # one version's registry record: what serves is the serving record
            if (adapter := lora_adapter_of(spec)) is not None:
                self._adapter_versions[(spec.name, spec.version)] = adapter  # what its release routes to
            return
        if spec.state == ModelState.SERVING and spec.release is not None:
            self._releases[spec.name] = spec.release
        else:
            self._releases.pop(spec.name, None)
        base = self._entries.get(spec.name, self._unknown)
        self._entries[spec.name] = base.model_copy(
            update={
                "tier": spec.tier or base.tier,
                "max_model_len": spec.max_model_len,
                "max_output_tokens": spec.max_output_tokens,
                "max_prompt_tokens": spec.max_prompt_tokens,
                "hosted": spec.hosted,
                "tokenizer": spec.tokenizer or base.tokenizer,
            }
        )
        self._unavailable.discard(spec.name)
        adapter = lora_adapter_of(spec)
        if adapter is not None:
            self.adapters[spec.name] = adapter
        else:
            self.adapters.pop(spec.name, None)

    def remove(self, model: str) -> None:
        """A tombstone on llm.models: nothing serves it any more."""
        self._unavailable.add(model)
