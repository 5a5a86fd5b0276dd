"""Settings shared by every service (env prefix LLMBUS_); services add their own prefix."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class BusSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    topic_prefix: str = ""
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Every Kafka call is bounded: a send waits at most send_timeout_s for the broker's ack.
    send_timeout_s: float = 15.0
    stop_timeout_s: float = 10.0
    commit_timeout_s: float = 10.0
    admin_timeout_s: float = 30.0
    request_timeout_ms: int = 10_000
    linger_ms: int = 2
    max_batch_bytes: int = 1_048_576
    poll_timeout_ms: int = 200
    max_poll_records: int = 500
    commit_interval_s: float = 0.2
    watchdog_s: float = 60.0
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    metrics_port: int = 0  # 0: no /metrics endpoint
    metrics_host: str = "0.0.0.0"  # bind address of /metrics (127.0.0.1: this machine only)
    log_level: str = "INFO"
    log_json: bool = True
    otel_console: bool = False  # print spans; set OTEL_EXPORTER_OTLP_ENDPOINT to export instead
    # Tracing is on when spans go somewhere (OTLP endpoint, console or trace_file); off, it costs nothing.
    trace_sample_ratio: float = 1.0  # share of new traces kept; a sampled parent's children always are
    trace_file: str | None = None  # append finished spans as JSON lines (tests, debugging)
