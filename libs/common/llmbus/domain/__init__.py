"""Pure rules shared by services and the CLI: fallback chains, experiment lifecycles, lineage."""
