"""llmbus.security: see docs/architecture.md, "The shared library"."""
