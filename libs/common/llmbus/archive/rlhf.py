"""RLHF training records (pure): a request's prompt, its answer and what ran it, joined with its feedback.

One record per answered request (tenant, request id) on the primary path; shadow copies are left
out (no user saw them). The join is by (tenant, request id): the request from llm.requests (the
prompt; absent when the archive keeps no prompts), its result on llm.results (answer text, model
and version, the release it ran under, experiment and variant, usage, timings), its cost on
llm.costs, and every feedback on it from llm.feedback (in the order given; `score` is the last one).
The schema is `RlhfRecord`'s, committed as schemas/exports/RlhfRecord.json
(tests/unit/test_archive_rlhf.py keeps them equal).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llmbus.contract.messages import ReleaseContext

RLHF_SCHEMA_VERSION: Literal[1] = 1


class FeedbackEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    score: float = Field(ge=0.0, le=1.0, description="0 (bad) to 1 (good), as the user gave it.")
    comment: str | None = None
    received_at_ms: int = Field(description="When the feedback record reached the bus (epoch ms).")


class PromptTurn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class RlhfRecord(BaseModel):
    """One training sample: what was asked, what was answered, by what, and how the user scored it."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = RLHF_SCHEMA_VERSION
    request_id: str
    tenant: str
    session_id: str | None = None
    user_id: str | None = Field(default=None, description="As on the result: HMAC-SHA256 where the tenant hashes ids.")
    category: str | None = None
    prompt_messages: list[PromptTurn] | None = Field(
        default=None, description="The chat as sent; None when the request is not in the archive."
    )
    prompt_text: str | None = Field(default=None, description="A completions-style prompt, when one was sent.")
    response_text: str
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    model: str | None = None
    model_version: str | None = None
    release: ReleaseContext | None = Field(
        default=None, description="The release it ran under: upgrade id, version, previous version, stage."
    )
    tier: str | None = None
    route_reason: str | None = None
    worker_id: str | None = None
    experiment_id: str | None = None
    variant: str | None = None
    cached: bool = Field(description="Served from the router's cache.")
    prompt_tokens: int
    completion_tokens: int
    cost_micro_usd: int | None = Field(
        default=None, description="From llm.costs; None when no cost record is archived."
    )
    ttft_ms: float | None = None
    total_ms: float | None = None
    completed_at_ms: int
    feedback: list[FeedbackEntry] = Field(description="Every feedback on the request, oldest first.")
    score: float | None = Field(default=None, description="The last feedback's score; None without feedback.")


Key = tuple[str, str]


def _key(row: dict[str, Any]) -> Key:
    return (row["tenant"], row["request_id"])


def join(
    results: Iterable[dict[str, Any]],
    requests: Iterable[dict[str, Any]],
    feedback: Iterable[dict[str, Any]],
    costs: Iterable[dict[str, Any]],
    *,
    since_ms: int = 0,
    labelled_only: bool = True,
) -> list[RlhfRecord]:
    """Archive rows (llmbus.archive.read) → training records, in completion order.

    `labelled_only`: only requests with at least one feedback (else every answered request)."""
    prompts = {_key(row): row["message"] for row in requests}
    costs_by_key = {_key(row): row["message"] for row in costs if row["message"].get("kind") != "idle"}
    scores: dict[Key, list[FeedbackEntry]] = {}
    for row in sorted(feedback, key=lambda r: r["event_time_ms"]):
        message = row["message"]
        entry = FeedbackEntry(
            score=message["score"], comment=message.get("comment"), received_at_ms=row["event_time_ms"]
        )
        scores.setdefault(_key(row), []).append(entry)
    out = []
    for row in sorted(results, key=lambda r: r["event_time_ms"]):
        result = row["message"]
        if result.get("shadow") or result["status"] != "ok" or row["event_time_ms"] < since_ms:
            continue
        key = _key(row)
        given = scores.get(key, [])
        if labelled_only and not given:
            continue
        out.append(_record(result, prompts.get(key), costs_by_key.get(key), given))
    return out


def _record(
    result: dict[str, Any], request: dict[str, Any] | None, cost: dict[str, Any] | None, given: list[FeedbackEntry]
) -> RlhfRecord:
    usage, timings = result.get("usage", {}), result.get("timings", {})
    return RlhfRecord(
        request_id=result["request_id"],
        tenant=result["tenant"],
        session_id=result.get("session_id"),
        user_id=result.get("user_id"),
        category=result.get("category"),
        prompt_messages=[PromptTurn(**turn) for turn in request.get("messages", [])] if request else None,
        prompt_text=request.get("prompt") if request else None,
        response_text=result.get("text", ""),
        tool_calls=result.get("tool_calls"),
        finish_reason=result.get("finish_reason"),
        model=result.get("model"),
        model_version=result.get("model_version"),
        release=ReleaseContext.model_validate(result["release"]) if result.get("release") else None,
        tier=result.get("tier"),
        route_reason=result.get("route_reason"),
        worker_id=result.get("worker_id"),
        experiment_id=result.get("experiment_id"),
        variant=result.get("variant"),
        cached=result.get("cached", False),
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        cost_micro_usd=cost.get("cost_micro_usd", 0) if cost else None,
        ttft_ms=timings.get("ttft_ms"),
        total_ms=timings.get("total_ms"),
        completed_at_ms=result["completed_at_ms"],
        feedback=given,
        score=given[-1].score if given else None,
    )
