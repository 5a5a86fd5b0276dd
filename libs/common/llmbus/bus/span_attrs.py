"""Span attributes of a message: GenAI semantic conventions plus llmbus's own (pure).

The publisher puts them on each PRODUCER span, so every hop of a trace says what it
carried (the route rule on the router's hop, worker and attempt on the scheduler's, usage,
node, GPU, model version and preemptions on the result) without code in the handlers. A record
of a release (its `release`: routed request, dispatch, result, final chunk, cost record,
comparison, decisions) says which: upgrade id, model version, previous version, stage, share.
"""

from __future__ import annotations

from llmbus.contract import semconv as sc
from llmbus.contract.messages import (
    Control,
    Dispatch,
    DispatchOutcome,
    InferenceRequest,
    InferenceResult,
    Message,
    ReleaseContext,
    RoutedRequest,
)

Attributes = dict[str, str | int | float | bool | list[str]]


def release_attributes(release: ReleaseContext | None) -> Attributes:
    if release is None:
        return {}
    out: Attributes = {
        sc.LLMBUS_UPGRADE_ID: release.upgrade_id,
        sc.LLMBUS_MODEL_VERSION: release.model_version,
        sc.LLMBUS_RELEASE_STAGE: release.stage.value,
        sc.LLMBUS_RELEASE_SHARE_PCT: release.share_pct,
    }
    if release.previous_version is not None:
        out[sc.LLMBUS_MODEL_PREVIOUS_VERSION] = release.previous_version
    return out


def _request(req: InferenceRequest) -> Attributes:
    out: Attributes = {
        sc.GEN_AI_OPERATION_NAME: "chat" if req.messages else "text_completion",
        sc.GEN_AI_REQUEST_MAX_TOKENS: req.max_tokens,
        sc.LLMBUS_REQUEST_ID: req.request_id,
        sc.LLMBUS_TENANT: req.tenant,
    }
    # Only what the request sets (unset: the model's default, which the request does not know).
    if req.temperature is not None:
        out[sc.GEN_AI_REQUEST_TEMPERATURE] = req.temperature
    if req.top_p is not None:
        out[sc.GEN_AI_REQUEST_TOP_P] = req.top_p
    if req.model:
        out[sc.GEN_AI_REQUEST_MODEL] = req.model
    return out


def _routed(routed: RoutedRequest) -> Attributes:
    out = _request(routed.request) | {
        sc.GEN_AI_REQUEST_MODEL: routed.model,
        sc.LLMBUS_ROUTE_RULE: routed.route_reason,
        sc.LLMBUS_SHADOW: routed.shadow,
    }
    if routed.variant:
        out[sc.LLMBUS_ROUTE_VARIANT] = routed.variant
    if routed.experiment_id:
        out[sc.LLMBUS_EXPERIMENT_ID] = routed.experiment_id
    return out | release_attributes(routed.release)


def _dispatch(dispatch: Dispatch) -> Attributes:
    return _routed(dispatch.routed) | {
        sc.LLMBUS_WORKER_ID: dispatch.worker_id,
        sc.LLMBUS_ATTEMPT: dispatch.attempt,
        sc.LLMBUS_QUEUE_TIME_MS: max(0, dispatch.dispatched_at_ms - dispatch.routed.received_at_ms),
    }


def _result(result: InferenceResult) -> Attributes:
    out: Attributes = {
        sc.LLMBUS_REQUEST_ID: result.request_id,
        sc.LLMBUS_TENANT: result.tenant,
        sc.LLMBUS_STATUS: str(result.status),
        sc.LLMBUS_ATTEMPT: result.attempt,
        sc.LLMBUS_SHADOW: result.shadow,
        sc.GEN_AI_USAGE_INPUT_TOKENS: result.usage.prompt_tokens,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: result.usage.completion_tokens,
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: result.usage.cached_prompt_tokens,
        sc.LLMBUS_CACHED_PREFIX_TOKENS: result.usage.cached_prompt_tokens,
        sc.LLMBUS_PREEMPTIONS: result.preemptions,
    }
    optional: dict[str, object] = {
        sc.GEN_AI_RESPONSE_MODEL: result.model,
        sc.GEN_AI_RESPONSE_FINISH_REASONS: [str(result.finish_reason)] if result.finish_reason else None,
        sc.GEN_AI_CONVERSATION_ID: result.session_id,
        sc.LLMBUS_WORKER_ID: result.worker_id,
        sc.LLMBUS_NODE_ID: result.node_id,
        sc.LLMBUS_GPU: result.gpu,
        sc.LLMBUS_MODEL_VERSION: result.model_version,
        sc.LLMBUS_MODEL_FORMAT: result.model_format,
        sc.LLMBUS_ROUTE_RULE: result.route_reason,
        sc.LLMBUS_ROUTE_VARIANT: result.variant,
        sc.LLMBUS_EXPERIMENT_ID: result.experiment_id,
        sc.LLMBUS_QUEUE_TIME_MS: result.timings.queued_ms,
        sc.GEN_AI_SERVER_TTFT: result.timings.ttft_ms / 1000 if result.timings.ttft_ms is not None else None,
        sc.LLMBUS_ERROR_CODE: str(result.error.code) if result.error else None,
        sc.ERROR_TYPE: str(result.error.code) if result.error else None,
    }
    out.update({k: v for k, v in optional.items() if v is not None})  # type: ignore[misc]
    return out | release_attributes(result.release)


def _outcome(outcome: DispatchOutcome) -> Attributes:
    out: Attributes = {
        sc.LLMBUS_REQUEST_ID: outcome.request_id,
        sc.LLMBUS_WORKER_ID: outcome.worker_id,
        sc.LLMBUS_ATTEMPT: outcome.attempt,
        sc.LLMBUS_OUTCOME: str(outcome.status),
    }
    if outcome.error:
        out[sc.LLMBUS_ERROR_CODE] = str(outcome.error.code)
    return out


def message_attributes(value: Message) -> Attributes:
    match value:
        case InferenceRequest():
            return _request(value)
        case RoutedRequest():
            return _routed(value)
        case Dispatch():
            return _dispatch(value)
        case InferenceResult():
            return _result(value)
        case DispatchOutcome():
            return _outcome(value)
        case Control():
            return {sc.LLMBUS_CONTROL_ACTION: str(value.action), sc.LLMBUS_REQUEST_ID: value.target_id}
    # Cost records, comparisons, decisions, scaling decisions, final chunks: their release, if any.
    return release_attributes(getattr(value, "release", None))
