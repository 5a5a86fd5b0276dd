"""Settings shared by every service (env prefix LLMBUS_); services add their own prefix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

KIB = 1024
MIB = 1024 * KIB


def cache_root() -> Path:
    """This machine's llmbus files (the venv, Kafka, run files, the archive, test models):
    `$LLMBUS_CACHE`, default ~/.cache/llmbus. Read at each call, so a process started with another
    LLMBUS_CACHE (a test's stack) uses its own."""
    return Path(os.environ.get("LLMBUS_CACHE") or Path.home() / ".cache" / "llmbus")


def _with_user(url: str, user: str) -> str:
    """`url` with `user` as its user part (every Redis client built from the URL logs in as that user)."""
    parts = urlsplit(url)
    if parts.username is not None:
        if unquote(parts.username) != user:
            raise ValueError(f"redis_url names user {parts.username!r}, redis_username {user!r}")
        return url
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}@{parts.netloc}"))


class BusSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    topic_prefix: str = ""
    redis_url: str = "redis://127.0.0.1:6379/0"
    # True: `redis_url` names one node of a Redis Cluster, and the services use a cluster client.
    redis_cluster: bool = False
    redis_password: SecretStr | None = None  # Redis AUTH (requirepass); kept out of the URL and of logs
    # The service's Redis ACL user (llmbus.security.redis_acls), with redis_password as its password; it
    # becomes the user part of redis_url (redis://<user>@host:port/db). None: Redis's default user.
    redis_username: str | None = None
    # Broker identity (docs/security.md): SASL/SCRAM when a username is set. Auth on also turns on
    # the tenant rules: tenants follow from the request topic, replies stay in the tenant's namespace.
    kafka_security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = "SCRAM-SHA-512"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: str | None = None  # SASL_SSL: the CA that signed the broker's certificate
    # Every Kafka call is bounded: a send waits at most send_timeout_s for the broker's ack.
    send_timeout_s: float = 15.0
    # What must not be lost (results, routed requests, dispatches, outcomes) is retried this long,
    # a broker restart included: a late ack is waited for, a failed send sent again unchanged.
    publish_retry_s: float = 300.0
    stop_timeout_s: float = 10.0
    commit_timeout_s: float = 10.0  # one commit, retries of retriable errors included
    admin_timeout_s: float = 30.0
    # How long a service waits at start for the state it follows (models, experiments, budgets, the
    # fleet) to be read to where it ended, before it serves anyway (llmbus.bus.service).
    catch_up_s: float = 15.0
    request_timeout_ms: int = 10_000
    # 0: a record leaves at once when nothing is in flight to its broker (a wait here is added to
    # every hop's latency); under load records still share produce requests, because aiokafka sends
    # one request per broker at a time and what arrives meanwhile is batched.
    linger_ms: int = 0
    max_batch_bytes: int = 1_048_576
    # The one size limit of the bus: producers refuse a record over max_message_bytes, topics are
    # created to accept it (max.message.bytes = this + a batch's framing), and an edge service
    # refuses requests over max_message_bytes - request_headroom_bytes (what routing adds must fit).
    max_message_bytes: int = 1024 * KIB
    request_headroom_bytes: int = 64 * KIB
    # A dead letter keeps at most this many raw bytes of the failing record (value; keys 1 KiB),
    # with its full size and topic/partition/offset: the original stays findable in its topic.
    dlq_max_payload_bytes: int = 64 * KIB
    # A DLQ write that fails is retried with backoff this long, then logged, counted and skipped.
    dlq_retry_s: float = 30.0
    # Topics are created with these (dev: one broker). Production: 3 and 2, so that acks=all
    # survives the loss of one broker and refuses writes rather than keep a single copy.
    replication_factor: int = 1
    min_insync_replicas: int = 1
    # How old a client's view of partition leaders may get. aiokafka (0.14) retries a fetch from a
    # broker that died (NodeNotReadyError) against that broker without asking who leads now, until
    # the metadata ages out (its default: 5 min): with one broker of three SIGKILLed, a consumer's
    # partitions stood still for the whole outage although their leaders had moved within seconds
    # (the 3-broker `leader_sigkill` scenario). A metadata request every few seconds per client is cheap.
    metadata_max_age_ms: int = 5_000
    poll_timeout_ms: int = 200
    max_poll_records: int = 500
    commit_interval_s: float = 0.2
    watchdog_s: float = 60.0
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    metrics_port: int = 0  # 0: no /metrics endpoint
    # Bind address of /metrics: this machine only by default; containers (compose, k8s) set 0.0.0.0.
    metrics_host: str = "127.0.0.1"
    log_level: str = "INFO"
    log_json: bool = True
    # How long `final:<request id>` markers (and attempt fences) outlive a request: a Dispatch
    # redelivered later than this could run again. Keep it above llm.dispatch's retention of
    # unconsumed records in practice (a worker down longer than this replays its backlog).
    final_marker_ttl_s: int = 24 * 3600
    # Retention (ms) per topic, over the catalog's defaults (docs/topics.md), by catalog name without the
    # namespace prefix, e.g. LLMBUS_TOPIC_RETENTION_MS='{"llm.results": 2592000000}'; -1 keeps forever.
    # Applied when a topic is created; a live topic's config is changed by an operator (kafka-configs).
    topic_retention_ms: dict[str, int] = {}
    cpu_profile: str | None = None  # a directory: the process's CPU-time profile is written there at exit
    otel_console: bool = False  # print spans; set OTEL_EXPORTER_OTLP_ENDPOINT to export instead
    # Tracing is on when spans go somewhere (OTLP endpoint, console or trace_file); off, it costs nothing.
    trace_sample_ratio: float = 1.0  # share of new traces kept; a sampled parent's children always are
    trace_file: str | None = None  # append finished spans as JSON lines (tests, debugging)

    @model_validator(mode="after")
    def _limits_agree(self) -> BusSettings:
        if not 1 <= self.min_insync_replicas <= self.replication_factor:
            raise ValueError("need 1 <= min_insync_replicas <= replication_factor")
        if self.request_headroom_bytes >= self.max_message_bytes:
            raise ValueError("request_headroom_bytes must be below max_message_bytes")
        if self.auth_enabled and not (self.kafka_sasl_username and self.kafka_sasl_password):
            raise ValueError(f"{self.kafka_security_protocol} needs kafka_sasl_username and kafka_sasl_password")
        if self.redis_username:
            self.redis_url = _with_user(self.redis_url, self.redis_username)
        return self

    def redis_url_of(self, url: str | None) -> str:
        """A Redis of this service's own (`url`; None: `redis_url`), logged in to as its Redis user."""
        if url is None:
            return self.redis_url
        return _with_user(url, self.redis_username) if self.redis_username else url

    @property
    def auth_enabled(self) -> bool:
        """The broker authenticates this client: tenants follow from topics, not from message bodies."""
        return self.kafka_security_protocol != "PLAINTEXT"

    @property
    def max_request_bytes(self) -> int:
        """Largest request an edge service accepts: its routed and dispatched forms must still fit."""
        return self.max_message_bytes - self.request_headroom_bytes

    @property
    def topic_max_message_bytes(self) -> int:
        """What topics accept: a producer's largest record plus the framing of its batch."""
        return self.max_message_bytes + 16 * KIB


class ObjectStoreSettings(BaseSettings):
    """The S3-compatible object store (model artifacts, the archive's bucket target): any endpoint that
    speaks the S3 API with signature v4. The local one is deploy/objectstore/objectstore.sh's."""

    model_config = SettingsConfigDict(env_prefix="LLMBUS_S3_", extra="ignore")

    endpoint: str = "http://127.0.0.1:9000"  # scheme, host and port; https:// for TLS
    access_key: str | None = None
    secret_key: SecretStr | None = None
    region: str = "us-east-1"
    # Keys left unset are read from this file (access_key=... and secret_key=... lines): the one
    # objectstore.sh generates for the local store. Compose and Kubernetes set the keys from secrets.
    credentials_file: Path = Field(default_factory=lambda: cache_root() / "run" / "objectstore.credentials")
    ca_file: str | None = None  # an https endpoint whose certificate a private CA signed
    # Every call is bounded: connecting, and each read of a response (a long GET streams many reads).
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    retries: int = 3  # of one request that failed on the connection or with a 5xx, with backoff
    # Uploads above this size are multipart, in parts of this size (S3: 5 MiB to 5 GiB, at most 10,000 parts).
    part_size_bytes: int = Field(default=64 * MIB, ge=5 * MIB)

    def keys(self) -> tuple[str, str]:
        """(access key, secret key): the settings', else the credentials file's; ValueError if neither has them."""
        access, secret = self.access_key, self.secret_key.get_secret_value() if self.secret_key else None
        if not (access and secret) and self.credentials_file.is_file():
            lines = self.credentials_file.read_text().splitlines()
            found = dict(line.split("=", 1) for line in lines if "=" in line)
            access, secret = access or found.get("access_key"), secret or found.get("secret_key")
        if not (access and secret):
            raise ValueError(
                f"no object store credentials: set LLMBUS_S3_ACCESS_KEY and LLMBUS_S3_SECRET_KEY, or start the local"
                f" store (deploy/objectstore/objectstore.sh start writes {self.credentials_file})"
            )
        return access, secret
