"""llmbus.observability: see docs/architecture.md, "The shared library"."""
