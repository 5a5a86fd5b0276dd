"""Actuators behind one Protocol (`Actuator`): local processes, Kubernetes, or none (dry run)."""

from llmbus_services.autoscaler.adapters.actuators.base import Actuator, NoActuator

__all__ = ["Actuator", "NoActuator"]
