"""services/engine_worker/adapters."""
