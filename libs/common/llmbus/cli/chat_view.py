"""How `llmbus chat` shows a streamed answer, following the chunk contract (llmbus.contract.chunks)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from llmbus.contract.chunks import TextUpdate
from llmbus.contract.messages import ErrorInfo, ToolCall, ToolCallDelta
from llmbus.contract.tool_calls import assemble_tool_calls

RESTART_NOTICE = "[yellow]↻ attempt {attempt}: the answer restarts (the text above is void)[/yellow]"


@dataclass(frozen=True)
class Shown:
    text: str  # the final attempt's only
    error: ErrorInfo | None
    model: str | None
    tool_calls: tuple[ToolCall, ...] = ()  # the final attempt's, assembled


async def show_stream(updates: AsyncIterator[TextUpdate], console: Console) -> Shown:
    """Print each update as it comes, the tool calls of the answer, and an error result's code and message."""
    started = time.perf_counter()
    error: ErrorInfo | None = None
    model: str | None = None
    first: float | None = None
    text: list[str] = []
    fragments: list[ToolCallDelta] = []
    async for update in updates:
        chunk = update.chunk
        if update.restarted:
            # A terminal cannot take back what it printed: say plainly that it no longer counts.
            console.print()
            console.print(RESTART_NOTICE.format(attempt=chunk.attempt))
            text, fragments = [], []
            first = None
        if update.delta and first is None:
            first = time.perf_counter()
        text.append(update.delta)
        fragments += chunk.tool_calls or []
        console.print(update.delta, end="", soft_wrap=True, highlight=False, markup=False)
        if update.final:
            console.print()
            error, model = chunk.error, chunk.model
            for call in assemble_tool_calls(fragments):
                console.print(
                    f"[cyan]tool call {escape(call.id)}: {escape(call.function.name)}"
                    f"({escape(call.function.arguments)})[/cyan]"
                )
            if error is not None:
                console.print(f"[red]error {error.code}: {escape(error.message)}[/red]")
            usage = chunk.usage
            ttft = f"{(first - started) * 1000:.0f} ms" if first else "-"
            route = f"{escape(model or '-')} ({escape(chunk.route_reason or '-')})"
            console.print(
                f"[dim]{route} · usage: prompt {usage.prompt_tokens if usage else 0}, completion "
                f"{usage.completion_tokens if usage else 0} tokens · attempt {chunk.attempt} · chunks {chunk.seq + 1}"
                f" · TTFT {ttft} · total {(time.perf_counter() - started) * 1000:.0f} ms[/dim]"
            )
    return Shown("".join(text), error, model, tuple(assemble_tool_calls(fragments)))
