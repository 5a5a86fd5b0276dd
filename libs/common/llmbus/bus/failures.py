"""The bus's reading of a failure: llmbus.state.errors's one classification, and the publisher's own give-ups."""

from __future__ import annotations

from llmbus.bus.producer import DeliveryAbandoned, PublishTimeout
from llmbus.state.errors import Failure, classify


def failure_of(exc: BaseException) -> Failure:
    """llmbus.state.errors.classify, where a record the broker did not acknowledge within
    publish_retry_s (or whose producer was replaced first) may go out on a later try: transient."""
    if isinstance(exc, (PublishTimeout, DeliveryAbandoned)):
        return Failure.TRANSIENT
    return classify(exc)


def transient(exc: BaseException) -> bool:
    """The same call may succeed later, so the record waits, not the DLQ."""
    return failure_of(exc) is Failure.TRANSIENT
