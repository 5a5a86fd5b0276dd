"""BusSettings: what every service shares, as its environment sets it."""

from __future__ import annotations

from llmbus.settings import BusSettings


def test_a_services_own_redis_is_logged_in_to_as_its_redis_user() -> None:
    """The router's state Redis (LLMBUS_ROUTER_STATE_REDIS_URL) under per-service ACL users: without the user
    the client would log in as `default` with the router's password, and be refused."""
    settings = BusSettings(redis_username="router")
    assert settings.redis_url_of("redis://10.0.0.5:6380/0") == "redis://router@10.0.0.5:6380/0"
    assert settings.redis_url_of(None) == settings.redis_url == "redis://router@127.0.0.1:6379/0"
    assert BusSettings().redis_url_of("redis://10.0.0.5:6380/0") == "redis://10.0.0.5:6380/0"
