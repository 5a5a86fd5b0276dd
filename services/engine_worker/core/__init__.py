"""services/engine_worker/core."""
