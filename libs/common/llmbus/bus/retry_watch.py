"""Records whose handler is being retried in place, watched: a retry that never ends is a stall too.

The consumer loop's watchdog notices a poll loop that stopped coming round. A handler retried in
place (llmbus.bus.bindings) keeps the loop polling while its record waits, uncommitted, for Redis or
Kafka to come back: harmless for a minute, a stall if it never ends (Redis out of memory for good, a
cluster that lost a slot). Each service's oldest retry is a metric, and past `stuck_after_s` (the
watchdog's time) the service reports itself not live (`llmbus_service_live` 0, `live` False, a
critical log line); it is not restarted for it, since a restart would meet the same Redis.
"""

from __future__ import annotations

import itertools
import logging
import time

from prometheus_client import Gauge

log = logging.getLogger(__name__)

RETRYING_SECONDS = Gauge(
    "llmbus_handler_retrying_seconds",
    "How long the oldest record now retried in place has been (0: none)",
    ["service"],
)
LIVE = Gauge(
    "llmbus_service_live", "1 while no handler has been retried in place past the watchdog's time", ["service"]
)


class RetryWatch:
    def __init__(self, service: str, stuck_after_s: float) -> None:
        self.service = service
        self.stuck_after_s = stuck_after_s
        self._since: dict[int, tuple[str, float]] = {}  # retry → (topic, monotonic start)
        self._ids = itertools.count()
        self._reported: set[int] = set()
        RETRYING_SECONDS.labels(service).set_function(self.oldest_s)
        LIVE.labels(service).set_function(lambda: 1.0 if self.live else 0.0)

    def begin(self, topic: str) -> int:
        """A record's handler failed transiently for the first time: its retries start now."""
        retry = next(self._ids)
        self._since[retry] = (topic, time.monotonic())
        return retry

    def end(self, retry: int) -> None:
        self._since.pop(retry, None)
        self._reported.discard(retry)

    def oldest_s(self) -> float:
        now = time.monotonic()
        return max((now - since for _, since in self._since.values()), default=0.0)

    @property
    def live(self) -> bool:
        return self.oldest_s() <= self.stuck_after_s

    def check(self, retry: int) -> None:
        """Called at each retry: the first time it is past `stuck_after_s`, say so loudly."""
        topic, since = self._since.get(retry, ("", time.monotonic()))
        if retry not in self._reported and time.monotonic() - since > self.stuck_after_s:
            self._reported.add(retry)
            log.critical(
                "%s: a record of %s has been retried in place for %.0fs: not live until it succeeds",
                self.service,
                topic,
                time.monotonic() - since,
            )
