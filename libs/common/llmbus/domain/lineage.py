"""A request's lineage, rebuilt from the topics alone (pure): what `llmbus trace` prints.

Every record of a request carries its id (header or field), so its whole path can be read
back from the log: the request, how it was routed, every attempt (which worker, node and
GPU, model version and format), how each attempt ended, the chunks of each attempt (and which
attempt's answer it continues), any cancel or dead letter, the one result (with queue time,
preemptions, cached tokens) and the legs of a continued answer (worker, model, tokens, why each
ended), and the release it ran under (upgrade id, version, previous version, stage).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus.contract.messages import (
    Control,
    DeadLetter,
    Dispatch,
    DispatchOutcome,
    InferenceRequest,
    InferenceResult,
    Leg,
    NodeProfile,
    ReleaseContext,
    RoutedRequest,
    TokenChunk,
    WorkerStatus,
)


@dataclass
class Attempt:
    number: int
    worker_id: str | None = None
    dispatched_at_ms: int | None = None
    outcome: DispatchOutcome | None = None
    chunks: list[TokenChunk] = field(default_factory=list)


@dataclass
class Lineage:
    request_id: str
    request: InferenceRequest | None = None
    routed: list[RoutedRequest] = field(default_factory=list)  # more than one: fallbacks, re-routes
    attempts: dict[int, Attempt] = field(default_factory=dict)
    controls: list[Control] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    results: list[InferenceResult] = field(default_factory=list)

    def attempt(self, number: int) -> Attempt:
        return self.attempts.setdefault(number, Attempt(number))

    def add(self, message: object) -> None:
        match message:
            case InferenceRequest():
                self.request = message
            case RoutedRequest():
                self.routed.append(message)
            case Dispatch():
                a = self.attempt(message.attempt)
                a.worker_id, a.dispatched_at_ms = message.worker_id, message.dispatched_at_ms
            case DispatchOutcome():
                a = self.attempt(message.attempt)
                a.worker_id = a.worker_id or message.worker_id
                a.outcome = message
            case TokenChunk():
                self.attempt(message.attempt).chunks.append(message)
            case Control():
                self.controls.append(message)
            case DeadLetter():
                self.dead_letters.append(message)
            case InferenceResult():
                self.results.append(message)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def release_line(release: ReleaseContext) -> str:
    previous = release.previous_version or "none (first version)"
    return (
        f"release {release.upgrade_id}: version {release.model_version}, previous {previous}, stage {release.label()}"
    )


def leg_line(number: int, leg: Leg) -> str:
    deployment = f" ({leg.deployment})" if leg.deployment else ""
    return (
        f"leg {number}: attempt {leg.attempt}, worker {leg.worker_id or '?'}, model {leg.model or '?'}{deployment}, "
        f"from seq {leg.first_seq}, {leg.text_chars} chars; prompt {leg.prompt_tokens} "
        f"(cached {leg.cached_prompt_tokens}), completion {leg.completion_tokens} tokens; ended {leg.ended}"
    )


def render(
    lineage: Lineage, workers: dict[str, WorkerStatus] | None = None, nodes: dict[str, NodeProfile] | None = None
) -> list[str]:
    """Plain lines, oldest first; worker heartbeats and node profiles fill in where a result is silent."""
    workers, nodes = workers or {}, nodes or {}
    lines = [f"request {lineage.request_id}"]
    if (req := lineage.request) is not None:
        asked = req.model or "(router's choice)"
        lines.append(
            f"  asked: tenant {req.tenant}, model {asked}, max_tokens {req.max_tokens}, reply topic {req.reply_topic}"
        )
    else:
        lines.append("  asked: (request not found on llm.requests)")
    for routed in lineage.routed:
        extra = f", experiment {routed.experiment_id} variant {routed.variant}" if routed.experiment_id else ""
        lines.append(
            f"  routed: -> {routed.model} ({routed.route_reason}{extra}), shadow {'yes' if routed.shadow else 'no'}, "
            f"fallback {routed.fallback_chain or '-'}, ~{routed.prompt_tokens_est} prompt tokens"
        )
        if routed.release is not None:
            lines.append(f"    {release_line(routed.release)}")
    results_by_attempt = {r.attempt: r for r in lineage.results}
    for number in sorted(lineage.attempts):
        a = lineage.attempts[number]
        status = workers.get(a.worker_id or "")
        result = results_by_attempt.get(number)
        node_id = (result and result.node_id) or (status and status.node_id) or "?"
        node = nodes.get(node_id)
        gpu = (result and result.gpu) or (node.gpus[0].name if node and node.gpus else None)
        version = (result and result.model_version) or (status and status.model_version) or "?"
        fmt = (result and result.model_format) or (status and status.model_format) or "?"
        lines.append(
            f"  attempt {number}: worker {a.worker_id or '?'} on node {node_id} ({gpu or 'no GPU'}), "
            f"model version {version} format {fmt}"
        )
        if a.chunks:
            seqs = sorted(c.seq for c in a.chunks)
            text_chars = sum(len(c.delta) for c in a.chunks)
            final = any(c.final for c in a.chunks)
            lines.append(
                f"    chunks: {len(a.chunks)} (seq {seqs[0]}..{seqs[-1]}), {text_chars} chars"
                f"{', final' if final else ', no final chunk (abandoned)'}"
            )
            if (marker := next((c.continues for c in a.chunks if c.continues is not None), None)) is not None:
                lines.append(f"    continues attempt {marker.attempt}'s answer from seq {marker.seq}")
        if a.outcome is not None:
            error = f" {a.outcome.error.code}: {a.outcome.error.message}" if a.outcome.error else ""
            lines.append(f"    outcome: {a.outcome.status}{error}")
    for control in lineage.controls:
        lines.append(f"  control: {control.action} ({control.reason or 'no reason given'})")
    for dead in lineage.dead_letters:
        lines.append(f"  dead letter from {dead.service} on {dead.source_topic}: {dead.error_code}: {dead.error}")
    if not lineage.results:
        lines.append("  result: none yet")
    for r in lineage.results:
        error = f" {r.error.code}: {r.error.message}" if r.error else ""
        t = r.timings
        lines.append(
            f"  result: {r.status}{error} by {r.produced_by or '?'} (attempt {r.attempt}), model {r.model or '-'}, "
            f"finish {r.finish_reason or '-'}{', from cache' if r.cached else ''}"
        )
        lines.append(
            f"    tokens: prompt {r.usage.prompt_tokens} (cached prefix {r.usage.cached_prompt_tokens}), "
            f"completion {r.usage.completion_tokens}; preemptions {r.preemptions}"
        )
        lines.append(
            f"    time: queued {_ms(t.queued_ms)}, first token {_ms(t.ttft_ms)}, total {_ms(t.total_ms)}, "
            f"per output token {_ms(t.tpot_ms)}"
        )
        for i, leg in enumerate(r.legs or [], start=1):
            lines.append(f"    {leg_line(i, leg)}")
        if r.release is not None:
            lines.append(f"    {release_line(r.release)}")
    if len(lineage.results) > 1:
        lines.append(f"  WARNING: {len(lineage.results)} results for one request id")
    return lines
