"""services/cost_accounting/adapters."""
