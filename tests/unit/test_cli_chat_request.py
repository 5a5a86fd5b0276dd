"""`llmbus chat` sends what the command line says and nothing else: an unset temperature stays unset (the
model's own default applies, as with the OpenAI API), a given one is sent."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from llmbus.cli import main
from llmbus.contract.messages import InferenceRequest


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[InferenceRequest]:
    requests: list[InferenceRequest] = []

    def capture(request: InferenceRequest) -> bool:
        requests.append(request)
        return True

    monkeypatch.setattr(main, "stream_answer", capture)
    return requests


def test_chat_without_temperature_sends_none(sent: list[InferenceRequest]) -> None:
    done = CliRunner().invoke(main.app, ["chat", "hello", "--max-tokens", "8"])
    assert done.exit_code == 0, done.output
    [request] = sent
    assert request.temperature is None and request.top_p is None
    assert "temperature" not in request.to_bytes().decode()  # absent on the wire, not null


def test_chat_with_temperature_sends_it(sent: list[InferenceRequest]) -> None:
    done = CliRunner().invoke(main.app, ["chat", "hello", "--temperature", "0.3"])
    assert done.exit_code == 0, done.output
    assert sent[0].temperature == 0.3
