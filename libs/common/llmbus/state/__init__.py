"""llmbus.state.store: see docs/architecture.md, "The shared library"."""
