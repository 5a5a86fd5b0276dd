"""How every Kafka client of llmbus authenticates: the one place SASL settings become client options.

Every producer, consumer and admin client takes `**kafka_auth(settings)`; FastStream brokers
take `security=faststream_security(settings)`. Nothing here logs or prints a password.
"""

from __future__ import annotations

import ssl
from typing import Any

from llmbus.settings import BusSettings


def _ssl_context(settings: BusSettings) -> ssl.SSLContext | None:
    if settings.kafka_security_protocol != "SASL_SSL":
        return None
    return ssl.create_default_context(cafile=settings.kafka_ssl_cafile)


def kafka_auth(settings: BusSettings) -> dict[str, Any]:
    """aiokafka options for the configured identity; {} in the unauthenticated dev mode."""
    if not settings.auth_enabled:
        return {}
    assert settings.kafka_sasl_password is not None  # BusSettings validates this
    options: dict[str, Any] = {
        "security_protocol": settings.kafka_security_protocol,
        "sasl_mechanism": settings.kafka_sasl_mechanism,
        "sasl_plain_username": settings.kafka_sasl_username,
        "sasl_plain_password": settings.kafka_sasl_password.get_secret_value(),
    }
    if (context := _ssl_context(settings)) is not None:
        options["ssl_context"] = context
    return options


def faststream_security(settings: BusSettings) -> Any:
    """FastStream's security object for the configured identity; None in dev mode."""
    if not settings.auth_enabled:
        return None
    from faststream.security import SASLPlaintext, SASLScram256, SASLScram512  # only services on FastStream

    kinds = {"SCRAM-SHA-512": SASLScram512, "SCRAM-SHA-256": SASLScram256, "PLAIN": SASLPlaintext}
    assert settings.kafka_sasl_username is not None and settings.kafka_sasl_password is not None
    context = _ssl_context(settings)
    return kinds[settings.kafka_sasl_mechanism](
        settings.kafka_sasl_username,
        settings.kafka_sasl_password.get_secret_value(),
        ssl_context=context,
        use_ssl=context is not None,
    )
