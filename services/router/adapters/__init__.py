"""The router's I/O: Redis caches, limits, coalescing, embedders, the latency watch, the state followers."""
