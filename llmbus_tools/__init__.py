"""llmbus_tools."""
