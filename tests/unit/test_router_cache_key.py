"""Cache keys: deterministic requests only, scoped by tenant, sensitive to every generation input."""

from __future__ import annotations

import pytest

from llmbus.contract.messages import InferenceRequest
from llmbus_services.router.core.cache_key import cache_key, cacheable


def req(**kw: object) -> InferenceRequest:
    base: dict[str, object] = {"prompt": "2+2?", "temperature": 0.0, "tenant": "acme"}
    return InferenceRequest(**(base | kw))  # type: ignore[arg-type]


def test_only_deterministic_requests_are_cacheable() -> None:
    assert cacheable(req())
    assert cacheable(req(temperature=0.7, seed=42))
    assert not cacheable(req(temperature=0.7))


def test_same_input_same_key_and_request_id_does_not_matter() -> None:
    assert cache_key(req(request_id="a"), "m") == cache_key(req(request_id="b"), "m")


def test_key_is_scoped_by_tenant() -> None:
    a, b = cache_key(req(tenant="acme"), "m"), cache_key(req(tenant="globex"), "m")
    assert a != b and a.startswith("acme:") and b.startswith("globex:")


@pytest.mark.parametrize(
    "change",
    [{"prompt": "2+3?"}, {"max_tokens": 10}, {"seed": 1}, {"top_p": 0.5}, {"stop": ["\n"]}],
)
def test_generation_inputs_change_the_key(change: dict[str, object]) -> None:
    assert cache_key(req(), "m") != cache_key(req(**change), "m")


def test_model_changes_the_key_and_messages_differ_from_prompt() -> None:
    assert cache_key(req(), "m1") != cache_key(req(), "m2")
    as_chat = req(prompt=None, messages=[{"role": "user", "content": "2+2?"}])
    assert cache_key(as_chat, "m") != cache_key(req(), "m")


def test_the_output_shape_is_part_of_the_key_only_when_asked() -> None:
    plain = cache_key(req(), "m")
    json_mode = cache_key(req(response_format={"type": "json_object"}), "m")
    fim = cache_key(req(suffix=" = 4"), "m")
    tools = cache_key(req(tools=[{"type": "function", "function": {"name": "f"}}]), "m")
    assert len({plain, json_mode, fim, tools}) == 4  # a JSON answer is never served for a text one
    assert cache_key(req(response_format={"type": "text"}), "m") == plain  # text is the default shape
    # Keys of requests without a shape are the ones computed before shapes existed: the cache stays warm.
    assert plain == "acme:68d98907b8479ed790154514b659282008235ca8ce822c6fd919b79fa20887ab"


def test_a_messages_tool_call_fields_are_part_of_the_key() -> None:
    call = {"id": "c1", "function": {"name": "lookup", "arguments": '{"q": "a"}'}}
    other = {"id": "c1", "function": {"name": "lookup", "arguments": '{"q": "b"}'}}

    def turn(calls: list[dict[str, object]], result: str, call_id: str = "c1") -> InferenceRequest:
        return req(
            prompt=None,
            messages=[
                {"role": "user", "content": "look it up"},
                {"role": "assistant", "tool_calls": calls},
                {"role": "tool", "tool_call_id": call_id, "content": result},
            ],
        )

    keys = {
        cache_key(turn([call], "1"), "m"),
        cache_key(turn([other], "1"), "m"),
        cache_key(turn([call], "1", "c2"), "m"),
    }
    assert len(keys) == 3
