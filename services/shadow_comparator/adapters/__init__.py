"""services/shadow_comparator/adapters."""
