"""The shadow-comparator's flow: results, costs, feedback and experiments into the Comparator; its
comparisons and decisions out (comparison.py)."""

from llmbus_services.shadow_comparator.flows.comparison import ComparatorHandlers

__all__ = ["ComparatorHandlers"]
