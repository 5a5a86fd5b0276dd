"""Prometheus metrics of the gateway (served on its own /metrics)."""

from prometheus_client import Counter, Gauge, Histogram

HTTP_REQUESTS = Counter(
    "llmbus_gateway_requests_total", "HTTP inference requests by endpoint and status", ["endpoint", "status"]
)
IN_FLIGHT = Gauge("llmbus_gateway_requests_in_flight", "Inference requests waiting for or streaming their answer")
TTFT_SECONDS = Histogram(
    "llmbus_gateway_time_to_first_token_seconds",
    "HTTP request received -> first token sent (or the whole answer, when not streaming)",
    ["endpoint"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
CANCELLED = Counter("llmbus_gateway_client_disconnects_total", "Requests cancelled because the client went away")
