"""services/gateway/adapters."""
