"""Kafka plumbing shared by every service: producer, consumer loop, headers, DLQ, topics admin."""

from llmbus.bus.codec import BadMessage, decode
from llmbus.bus.consumer import ConsumerLoop, make_consumer, stop_consumer
from llmbus.bus.producer import Publisher, PublishTimeout, make_producer
from llmbus.bus.runtime import Bus, run_service

__all__ = [
    "BadMessage",
    "Bus",
    "ConsumerLoop",
    "PublishTimeout",
    "Publisher",
    "decode",
    "make_consumer",
    "make_producer",
    "run_service",
    "stop_consumer",
]
