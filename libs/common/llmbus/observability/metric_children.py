"""A Prometheus metric's children looked up once per label values, for series touched per record;
and the bounded vocabularies of labels whose values come from client input (`KnownLabels`).

`metric.labels(...)` takes the metric's lock, validates and stringifies the values and looks
the child up again on every call: about a microsecond, paid on every record consumed or
produced. A child never changes for given label values, so the lookup is remembered; there is
at most one entry per child the metric already holds. Code that removes a metric's children
(label values that expire, like client-chosen model names) clears the remembered ones too
(`cache_clear()`), or it would keep counting on series no longer exported.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)
log = logging.getLogger(__name__)


def children_of(metric: M) -> Callable[..., M]:
    """`metric.labels`, remembered: call it with the label values, as `labels` is.

    Typed: `labels(1)` and `labels(True)` are different series, so they are different entries.
    """
    return functools.lru_cache(maxsize=None, typed=True)(metric.labels)


OTHER = "other"


class KnownLabels:
    """The values a label may take where they come from client input: the known ones, else `other`.

    A client chooses the model name of its request (the router passes unknown ones on, as asked) and,
    in dev mode, its tenant. Labelled as sent, 50 random names a second would be millions of series a
    day in every service that counts by them, each child remembered forever (`children_of`). So such a
    label goes through `label()`: a value the process has learned (`learn`: a service's policy, the
    model registry on llm.models, the fleet's heartbeats, the price book) is itself, anything else is
    `other`. `admit_first` lets that many unknown values in as they come (tenants: every real one is
    known only from its traffic), and `max_known` caps what may be learned at all: a forged heartbeat
    naming thousands of models (dev mode has no ACLs) cannot grow the series either.
    """

    def __init__(self, name: str, admit_first: int = 0, max_known: int = 10_000) -> None:
        self.name = name
        self.admit_first = admit_first
        self.max_known = max_known
        self._known: set[str] = set()
        self._admitted = 0
        self._full_logged = False

    def learn(self, values: Iterable[str]) -> None:
        """These values are known from now on (the caller's source is trusted: not client input)."""
        for value in values:
            if value and value not in self._known:
                if len(self._known) >= self.max_known:
                    self._log_full(value)
                    return
                self._known.add(value)

    def knows(self, value: str | None) -> bool:
        return value is not None and value in self._known

    def label(self, value: str | None) -> str:
        """`value` if it is known (or one of the first `admit_first` unknown ones), else `other`."""
        if not value:
            return OTHER
        if value in self._known:
            return value
        if self._admitted < self.admit_first and len(self._known) < self.max_known:
            self._admitted += 1
            self._known.add(value)
            return value
        return OTHER

    def _log_full(self, value: str) -> None:
        if not self._full_logged:
            self._full_logged = True
            log.warning(
                "%s labels: %d known already; %r and later ones are %r", self.name, self.max_known, value, OTHER
            )


# Every process's model labels (results, routes, costs, pool statistics): one vocabulary, fed by what the
# process trusts, so a name is labelled the same way by every metric of a service.
MODEL_LABELS = KnownLabels("model")
# Tenants in cost metrics: with auth on they come from topics an operator made; in dev mode from the body.
TENANT_LABELS = KnownLabels("tenant", admit_first=1_000)


def model_label(model: str | None) -> str:
    """The label of a model name: itself when this process knows it, else `other`."""
    return MODEL_LABELS.label(model)
