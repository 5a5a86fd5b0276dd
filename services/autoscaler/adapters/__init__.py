"""The autoscaler's I/O: the actuators that start and stop workers (local processes, Kubernetes)."""
