"""How every Kafka client of llmbus authenticates: the one place SASL settings become client options.

Every producer, consumer and admin client takes `**kafka_auth(settings)`. Nothing here logs or
prints a password.
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
