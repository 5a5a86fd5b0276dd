"""The node's hardware: the NVML probe with its CPU fallback (probe.py) and its Prometheus gauges (gauges.py)."""
