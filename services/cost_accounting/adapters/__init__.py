"""Cost-accounting's I/O: its Redis store and its metrics."""
