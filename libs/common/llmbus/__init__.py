"""llmbus: a Kafka-native control plane for LLM inference clusters."""

__version__ = "0.1.0"
