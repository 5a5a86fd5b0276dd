"""The node agent's I/O: the NVML probe (off the event loop)."""
