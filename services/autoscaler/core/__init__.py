"""Scaling policies (pure: no broker imports). Importing this package registers every policy."""

from llmbus_services.autoscaler.core import policies
from llmbus_services.autoscaler.core.base import POLICIES, Bounds, Decision, ScalingPolicy, build_policy
from llmbus_services.autoscaler.core.signals import FleetTable, PoolSignals

__all__ = ["POLICIES", "Bounds", "Decision", "FleetTable", "PoolSignals", "ScalingPolicy", "build_policy", "policies"]
