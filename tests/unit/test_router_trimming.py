"""Context trimming: system kept, newest turns kept, contiguous, starts at a user turn."""

from __future__ import annotations

from llmbus.contract.messages import ChatMessage, InferenceRequest
from llmbus.tokens import estimate_tokens
from llmbus_services.router.core.trimming import trim_to_window, turn_tokens


def chat(*turns: tuple[str, str]) -> InferenceRequest:
    return InferenceRequest(messages=[ChatMessage(role=r, content=c) for r, c in turns])  # type: ignore[arg-type]


def test_fitting_conversation_is_untouched() -> None:
    request = chat(("system", "be brief"), ("user", "hi"))
    result = trim_to_window(request, 8192, 256)
    assert result.fits and result.trimmed_tokens == 0 and result.messages == request.messages


def test_keeps_system_and_newest_turns_within_the_window() -> None:
    big = "x" * 4000  # ~1000 tokens per turn
    request = chat(
        ("system", "rules"),
        ("user", "old " + big),
        ("assistant", "a1 " + big),
        ("user", "mid " + big),
        ("assistant", "a2 " + big),
        ("user", "newest question"),
    )
    result = trim_to_window(request, max_model_len=2600, max_tokens=256)
    assert result.fits
    kept = [m.content[:6] for m in result.messages]
    assert result.messages[0].role == "system"
    assert result.messages[-1].content == "newest question"
    assert "old xx" not in kept and "a1 xxx" not in kept
    assert result.messages[1].role == "user"  # history starts at a user turn, never a dangling answer
    assert result.prompt_tokens <= 2600 - 256
    full = estimate_tokens(request.prompt_text())
    assert result.trimmed_tokens > 0 and result.prompt_tokens + result.trimmed_tokens >= full


def test_never_keeps_an_older_turn_past_a_gap() -> None:
    request = chat(("user", "short old"), ("assistant", "y" * 8000), ("user", "latest"))
    result = trim_to_window(request, max_model_len=1000, max_tokens=100)
    assert [m.content for m in result.messages] == ["latest"]


def test_refuses_when_even_the_last_turn_does_not_fit() -> None:
    request = chat(("system", "s"), ("user", "z" * 40_000))
    assert not trim_to_window(request, max_model_len=4096, max_tokens=256).fits
    prompt = InferenceRequest(prompt="p" * 40_000)
    result = trim_to_window(prompt, max_model_len=4096, max_tokens=256)
    assert not result.fits and result.trimmed_tokens == 0


def test_turn_count_upper_bounds_the_rendered_prompt() -> None:
    request = chat(("system", "abc"), ("user", "hello there"), ("assistant", "hi!"), ("user", "q?"))
    assert sum(turn_tokens(m) for m in request.messages) + 4 >= estimate_tokens(request.prompt_text())
