"""The autoscaler's flow: heartbeats into the fleet table, pool statistics through the pool's policy into a
ScaleDecision on llm.scaling and then the actuator (scaling.py)."""

from llmbus_services.autoscaler.flows.scaling import AutoscalerHandlers

__all__ = ["AutoscalerHandlers"]
