"""The worker's I/O: engines (plugins), the reply stream, the attempt's end, node profile, lifecycle, metrics."""
