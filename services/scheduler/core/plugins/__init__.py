"""Built-in plugins; importing this package fills the registries."""

from llmbus_services.scheduler.core.plugins import (
    filters_capability,
    filters_health,
    filters_lora,
    filters_model,
    pickers,
    scorers_affinity,
    scorers_hardware,
    scorers_load,
    scorers_lora,
)
from llmbus_services.scheduler.core.plugins.base import FILTERS, PICKERS, SCORERS, CycleState, Filter, Picker, Scorer

__all__ = [
    "FILTERS",
    "PICKERS",
    "SCORERS",
    "CycleState",
    "Filter",
    "Picker",
    "Scorer",
    "filters_capability",
    "filters_health",
    "filters_lora",
    "filters_model",
    "pickers",
    "scorers_affinity",
    "scorers_hardware",
    "scorers_load",
    "scorers_lora",
]
