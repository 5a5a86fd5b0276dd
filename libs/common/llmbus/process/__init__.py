"""Starting llmbus services as child processes (the dev stack, tests, benchmarks, the local autoscaler)."""
