"""The scheduler's I/O: its Redis store and the pool statistics it publishes."""
