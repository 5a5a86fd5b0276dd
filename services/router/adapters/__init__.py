"""The router's I/O: Redis caches, limits, coalescing, budgets, embedders, the state followers."""
