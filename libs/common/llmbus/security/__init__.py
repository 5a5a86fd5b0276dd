"""Who may do what: tenants and their topics, Kafka ACLs from the catalog, API keys (pure)."""
