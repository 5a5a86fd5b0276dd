"""The model catalog: YAML entries, overridden at runtime by ModelSpec records from llm.models."""

from __future__ import annotations

from collections.abc import Callable

from llmbus.contract.messages import ModelSpec
from llmbus.tokens import estimate_tokens, try_load
from llmbus_services.router.core.config import ModelEntry, RouterPolicy


class ModelCatalog:
    def __init__(self, policy: RouterPolicy) -> None:
        self._entries: dict[str, ModelEntry] = dict(policy.models)
        self._unknown = policy.limits.unknown_model_defaults
        # Models marked unavailable (e.g. a tombstone on llm.models, or an operator drain):
        # routing walks the fallback chain past them.
        self._unavailable: set[str] = set()

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

    def is_available(self, model: str) -> bool:
        return model not in self._unavailable

    def set_available(self, model: str, available: bool) -> None:
        (self._unavailable.discard if available else self._unavailable.add)(model)

    def apply_spec(self, spec: ModelSpec) -> None:
        """A ModelSpec wins over the YAML for the limits it carries; tier and cost rank stay if it has none."""
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

    def remove(self, model: str) -> None:
        """A tombstone on llm.models: nothing serves it any more."""
        self._unavailable.add(model)
