"""Built-in plugins; importing this package fills the registries."""

from llmbus_services.scheduler.core.plugins import (
    filters_health,
    filters_model,
    pickers,
    scorers_affinity,
    scorers_load,
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
    "filters_health",
    "filters_model",
    "pickers",
    "scorers_affinity",
    "scorers_load",
]
