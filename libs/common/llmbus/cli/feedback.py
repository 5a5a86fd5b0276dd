"""`llmbus feedback`: a user's score of an answer, onto the tenant's own feedback topic when auth is on."""

from __future__ import annotations

import asyncio

import typer
from rich.console import Console

from llmbus.client import LlmbusClient
from llmbus.contract.messages import Feedback

console = Console()


def feedback(
    request_id: str = typer.Argument(..., help="the request the score is about"),
    score: float = typer.Argument(..., min=0.0, max=1.0, help="0 (bad) to 1 (good)"),
    comment: str | None = typer.Option(None, help="free text kept with the score"),
    tenant: str = typer.Option("default", help="dev mode only: with auth on the tenant is the principal's"),
) -> None:
    """Score an answer. It counts (experiments, retraining) only when it comes from the request's tenant."""

    async def _send() -> str:
        async with LlmbusClient() as client:
            topic, value = client.feedback_addressed(
                Feedback(request_id=request_id, tenant=tenant, score=score, comment=comment)
            )
            await client.send_feedback(value)
            return topic

    topic = asyncio.run(_send())
    console.print(f"feedback on {request_id} ({score}) sent to {topic}")
