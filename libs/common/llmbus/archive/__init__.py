"""The archive's on-disk layout, row schema and RLHF join, shared by services/archive and `llmbus export`."""
