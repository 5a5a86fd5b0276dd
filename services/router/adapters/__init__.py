"""services/router/adapters."""
