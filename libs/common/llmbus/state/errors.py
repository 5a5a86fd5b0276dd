"""What a failed call to Redis (or Kafka, or the network) means for the work that made it, decided once.

Every client of Redis asks here rather than catch its own list of exceptions:

- TRANSIENT: the same call may succeed later, the record is not at fault. Connections lost or
  timed out, and the answers Redis gives while it cannot take writes for a while: `OOM` (maxmemory
  with noeviction), `READONLY` (a replica, or a primary demoted by a failover), `CLUSTERDOWN`,
  `TRYAGAIN` and `MOVED`/`ASK` during a resharding, `MASTERDOWN` (a replica cut off from its primary),
  `BUSY` (a script running long), `LOADING` (a restart reading its data), `NOREPLICAS`. A handler
  that meets one is retried in place with backoff, its record uncommitted (llmbus.bus.bindings):
  never dead-lettered, since the record would be as good a minute later.
- FATAL: the process itself is misconfigured and no retry fixes it until an operator does:
  authentication refused (`WRONGPASS`, `NOAUTH`), a command or key the ACL user may not use
  (`NOPERM`), Kafka's authorisation errors. The record is not at fault either: a subscription's
  loop stops with the error, uncommitted, and the service exits non-zero (its supervisor shows it).
- PERMANENT: anything else: the record (or what the handler made of it) will fail the same way
  every time: it goes to llm.dlq with the reason, or the request path answers it.
"""

from __future__ import annotations

import enum

from aiokafka.errors import (
    AuthenticationFailedError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
from redis import exceptions as redis_errors

# The first word of a Redis error reply, for replies redis-py raises as a plain ResponseError.
TRANSIENT_REDIS_CODES = frozenset(
    {"OOM", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "BUSY", "LOADING", "NOREPLICAS", "MOVED", "ASK"}
)
FATAL_REDIS_CODES = frozenset({"NOPERM", "NOAUTH", "WRONGPASS"})
_TRANSIENT_REDIS = (
    redis_errors.ConnectionError,  # BusyLoadingError (LOADING) and MaxClientsReachedError are ConnectionErrors too
    redis_errors.TimeoutError,
    redis_errors.OutOfMemoryError,
    redis_errors.ReadOnlyError,
    redis_errors.ClusterDownError,  # MasterDownError is one
    redis_errors.TryAgainError,
    redis_errors.AskError,  # MovedError is one
    redis_errors.ClusterError,
    redis_errors.RedisClusterException,  # no node covers a slot / the cluster unreachable
)
_FATAL_REDIS = (redis_errors.AuthenticationError, redis_errors.AuthorizationError, redis_errors.NoPermissionError)
_FATAL_KAFKA = (
    AuthenticationFailedError,
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)


class Failure(enum.StrEnum):
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    FATAL = "fatal"


def redis_failure(exc: BaseException) -> Failure | None:
    """The kind of a Redis error; None when `exc` is not one."""
    if isinstance(exc, _FATAL_REDIS):  # before ConnectionError: the auth errors subclass it
        return Failure.FATAL
    if isinstance(exc, _TRANSIENT_REDIS):
        return Failure.TRANSIENT
    if isinstance(exc, redis_errors.ResponseError):
        code = str(exc).split(" ", 1)[0].upper()
        if code in FATAL_REDIS_CODES:
            return Failure.FATAL
        if code in TRANSIENT_REDIS_CODES:
            return Failure.TRANSIENT
        return Failure.PERMANENT
    if isinstance(exc, redis_errors.RedisError):
        return Failure.PERMANENT
    return None


def classify(exc: BaseException) -> Failure:
    """Redis, Kafka or the network: transient, fatal, or (anything else) permanent."""
    if (kind := redis_failure(exc)) is not None:
        return kind
    if isinstance(exc, _FATAL_KAFKA):
        return Failure.FATAL
    if isinstance(exc, KafkaError):
        return Failure.TRANSIENT if exc.retriable else Failure.PERMANENT
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return Failure.TRANSIENT
    return Failure.PERMANENT


def transient(exc: BaseException) -> bool:
    return classify(exc) is Failure.TRANSIENT
