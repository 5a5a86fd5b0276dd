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


def cacheable(request: InferenceRequest) -> bool:
    return request.deterministic


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
    if request.engine_features():  # only when asked, so that every other key stays what it was
        material["shape"] = {
            "response_format": request.response_format.model_dump() if request.response_format else None,
            "tools": request.tools,
            "tool_choice": request.tool_choice,
            "suffix": request.suffix,
        }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{request.tenant}:{digest}"
