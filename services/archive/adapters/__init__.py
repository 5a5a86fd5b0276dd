"""services/archive/adapters."""
