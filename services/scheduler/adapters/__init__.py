"""services/scheduler/adapters."""
