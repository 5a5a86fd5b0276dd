"""shadow-comparator settings (env prefix LLMBUS_COMPARATOR_)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class ComparatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_COMPARATOR_", extra="ignore")

    pair_ttl_s: int = 600  # how long one side of a pair waits for its partner
    done_ttl_s: int = 7 * 24 * 3600  # once-only markers and request → variant links (feedback comes late)
    max_text_chars: int = 16_000  # a stored side's text is cut here (Redis memory stays bounded)
    sweep_interval_s: float = 5.0
    decide_interval_s: float = 10.0  # the decision loop's tick (every tick is a look: tests are sequential)
    feedback_topic_discovery_ms: int = 5000  # auth on: how soon a new tenant's feedback topic is read
    decide: bool = True  # False: compare and aggregate only, never write llm.experiments
