"""How `llmbus chat` shows a streamed answer, following the chunk contract (llmbus.chunks)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from rich.console import Console

from llmbus.chunks import TextUpdate

RESTART_NOTICE = "[yellow]↻ attempt {attempt}: the answer restarts (the text above is void)[/yellow]"


async def show_stream(updates: AsyncIterator[TextUpdate], console: Console) -> str:
    """Print each update as it comes; returns the answer's text (the final attempt's only)."""
    started = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    async for update in updates:
        chunk = update.chunk
        if update.restarted:
            # A terminal cannot take back what it printed: say plainly that it no longer counts.
            console.print()
            console.print(RESTART_NOTICE.format(attempt=chunk.attempt))
            text = []
            first = None
        if update.delta and first is None:
            first = time.perf_counter()
        text.append(update.delta)
        console.print(update.delta, end="", soft_wrap=True, highlight=False, markup=False)
        if update.final:
            console.print()
            if chunk.error:
                console.print(f"[red]error {chunk.error.code}: {chunk.error.message}[/red]")
            usage = chunk.usage
            ttft = f"{(first - started) * 1000:.0f} ms" if first else "-"
            console.print(
                f"[dim]usage: prompt {usage.prompt_tokens if usage else 0}, completion "
                f"{usage.completion_tokens if usage else 0} tokens · attempt {chunk.attempt} · chunks {chunk.seq + 1}"
                f" · TTFT {ttft} · total {(time.perf_counter() - started) * 1000:.0f} ms[/dim]"
            )
    return "".join(text)
