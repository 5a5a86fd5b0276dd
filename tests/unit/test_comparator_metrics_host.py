"""The comparator serves /metrics where LLMBUS_METRICS_HOST says, as every service does (run_service)."""

from __future__ import annotations

import asyncio
import runpy
from typing import Any

import pytest

from llmbus.bus import runtime
from llmbus.settings import BusSettings


class Started(Exception):
    pass


def test_metrics_bind_the_configured_host(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def start_http_server(port: int, addr: str = "0.0.0.0") -> None:
        calls.append((port, addr))

    async def main(settings: BusSettings, stop: asyncio.Event) -> None:
        raise Started

    monkeypatch.setenv("LLMBUS_METRICS_PORT", "29104")
    monkeypatch.setenv("LLMBUS_METRICS_HOST", "127.0.0.1")
    monkeypatch.setattr(runtime, "start_http_server", start_http_server)
    monkeypatch.setattr(runtime, "setup_tracing", lambda *a, **k: False)
    monkeypatch.setattr("llmbus_services.shadow_comparator.app.main", main)
    with pytest.raises(Started):
        runpy.run_module("llmbus_services.shadow_comparator", run_name="__main__")
    assert calls == [(29104, "127.0.0.1")]
