"""llmbus.domain: see docs/architecture.md, "The shared library"."""
