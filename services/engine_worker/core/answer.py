"""One attempt's answer as the engine streams it (pure): the text, tool calls, log-probabilities and finish
reason of every choice (n > 1 gives several), and what the final result says of them."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus.contract.messages import Choice, FinishReason, TokenLogprob, ToolCall, ToolCallDelta
from llmbus.contract.tool_calls import assemble_tool_calls
from llmbus_services.engine_worker.core.engine import EngineOutput


@dataclass
class ChoiceSoFar:
    text: list[str] = field(default_factory=list)
    calls: list[ToolCallDelta] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None

    def tool_calls(self) -> list[ToolCall] | None:
        return assemble_tool_calls(self.calls) if self.calls else None


@dataclass
class Answer:
    """Fed every EngineOutput in order; `last` is the latest (its counts cover the whole request)."""

    choices: dict[int, ChoiceSoFar] = field(default_factory=dict)
    last: EngineOutput | None = None
    first_token_ms: float | None = None

    def add(self, out: EngineOutput, now_ms: float) -> None:
        self.last = out
        if out.new_tokens and self.first_token_ms is None:
            self.first_token_ms = now_ms
        choice = self.choices.get(out.index)
        if choice is None:
            choice = self.choices[out.index] = ChoiceSoFar()
        choice.text.append(out.delta)
        if out.tool_calls:
            choice.calls += out.tool_calls
        if out.logprobs:
            choice.logprobs += out.logprobs
        if out.finish_reason is not None:
            choice.finish_reason = out.finish_reason

    @property
    def first(self) -> ChoiceSoFar:
        return self.choices.get(0) or ChoiceSoFar()

    @property
    def aborted(self) -> bool:
        return self.last is not None and self.last.finish_reason == "abort"

    def finish_reason(self) -> FinishReason:
        reason = self.first.finish_reason or (self.last.finish_reason if self.last else None)
        return FinishReason(reason) if reason else FinishReason.STOP

    def other_choices(self) -> list[Choice] | None:
        """The choices after the first, as the result carries them (None for a request of one)."""
        others = [
            Choice(
                index=index,
                text="".join(choice.text),
                tool_calls=choice.tool_calls(),
                finish_reason=FinishReason(choice.finish_reason) if choice.finish_reason else FinishReason.STOP,
                logprobs=choice.logprobs or None,
            )
            for index, choice in sorted(self.choices.items())
            if index > 0
        ]
        return others or None
