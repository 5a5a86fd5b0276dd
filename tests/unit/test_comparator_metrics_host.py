"""The comparator serves /metrics where LLMBUS_METRICS_HOST says, as every service does."""

from __future__ import annotations

from typing import Any

import pytest

from services.shadow_comparator import app


class Started(Exception):
    pass


def test_metrics_bind_the_configured_host(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def start_http_server(port: int, addr: str = "0.0.0.0") -> None:
        calls.append((port, addr))

    def build(*_: Any) -> Any:
        raise Started

    monkeypatch.setenv("LLMBUS_METRICS_PORT", "29104")
    monkeypatch.setenv("LLMBUS_METRICS_HOST", "127.0.0.1")
    monkeypatch.setattr(app, "start_http_server", start_http_server)
    monkeypatch.setattr(app, "build", build)
    monkeypatch.setattr(app, "setup_tracing", lambda *a, **k: False)
    with pytest.raises(Started):
        app.main()
    assert calls == [(29104, "127.0.0.1")]
