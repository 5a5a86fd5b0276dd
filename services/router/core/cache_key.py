"""Exact-match cache keys (pure).

Only deterministic requests are cacheable (temperature 0, or a fixed seed): anything
else would replay one sample as if it were the answer. The key is a SHA-256 over a
canonical JSON of everything that changes the output — tenant, model, the input
(messages or prompt, suffix), the output's shape (JSON format, tools) and the generation
parameters — and the tenant is also the key's namespace, so a hit can never cross tenants
even if two tenants send the same bytes.
"""

from __future__ import annotations

import hashlib
import json

from llmbus.contract.messages import ChatMessage, InferenceRequest

_TOOL_FIELDS = {"name", "tool_calls", "tool_call_id"}


def _has_tool_fields(message: ChatMessage) -> bool:
    return message.name is not None or message.tool_calls is not None or message.tool_call_id is not None


# Parameters that change the output, in the key only when set (so that every other key stays what it was).
_PARAMETERS: tuple[str, ...] = ("presence_penalty", "frequency_penalty", "logit_bias", "parallel_tool_calls")
_PARAMETERS += ("reasoning_effort", "top_k", "min_p", "repetition_penalty")


def cacheable(request: InferenceRequest) -> bool:
    """Deterministic, and answered by one text: a cached answer holds no further choices (n > 1) and no
    log-probabilities, so requests for those generate."""
    return request.deterministic and request.choices == 1 and not request.logprobs


def cache_key(request: InferenceRequest, model: str) -> str:
    material: dict[str, object] = {
        "tenant": request.tenant,
        "model": model,
        # A message's tool-call fields only where it has them, so that every other key stays what it was.
        "messages": [
            [
                m.role,
                m.content,
                *([m.model_dump(mode="json", include=_TOOL_FIELDS, exclude_none=True)] if _has_tool_fields(m) else []),
                *([m.model_dump(mode="json", include={"content_parts"})] if m.content_parts else []),
            ]
            for m in request.messages
        ],
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": request.seed,
        "stop": request.stop,
    }
    if set_parameters := {name: value for name in _PARAMETERS if (value := getattr(request, name)) is not None}:
        material["parameters"] = set_parameters
    if request.engine_features():  # only when asked, so that every other key stays what it was
        material["shape"] = {
            "response_format": request.response_format.model_dump() if request.response_format else None,
            "tools": request.tools,
            "tool_choice": request.tool_choice,
            "suffix": request.suffix,
        }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{request.tenant}:{digest}"
