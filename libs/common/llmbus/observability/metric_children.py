"""A Prometheus metric's children looked up once per label values, for series touched per record.

`metric.labels(...)` takes the metric's lock, validates and stringifies the values and looks
the child up again on every call: about a microsecond, paid on every record consumed or
produced. A child never changes for given label values, so the lookup is remembered; there is
at most one entry per child the metric already holds. Code that removes a metric's children
(label values that expire, like client-chosen model names) clears the remembered ones too
(`cache_clear()`), or it would keep counting on series no longer exported.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)


def children_of(metric: M) -> Callable[..., M]:
    """`metric.labels`, remembered: call it with the label values, as `labels` is.

    Typed: `labels(1)` and `labels(True)` are different series, so they are different entries.
    """
    return functools.lru_cache(maxsize=None, typed=True)(metric.labels)
