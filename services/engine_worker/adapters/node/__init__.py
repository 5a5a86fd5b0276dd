"""The engine-worker's node: hardware profile (NVML / CPU), DCGM-named gauges, model format choice."""
