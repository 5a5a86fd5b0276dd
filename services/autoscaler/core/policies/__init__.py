"""The scaling policies, one module each; importing this package registers them (core/base.py's registry)."""

from llmbus_services.autoscaler.core.policies import predictive, threshold
from llmbus_services.autoscaler.core.policies.predictive import PredictiveParams, PredictivePolicy
from llmbus_services.autoscaler.core.policies.threshold import ThresholdParams, ThresholdPolicy

__all__ = ["PredictiveParams", "PredictivePolicy", "ThresholdParams", "ThresholdPolicy", "predictive", "threshold"]
