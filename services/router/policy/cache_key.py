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

from llmbus.messages import InferenceRequest


def cacheable(request: InferenceRequest) -> bool:
    return request.deterministic


def cache_key(request: InferenceRequest, model: str) -> str:
    material: dict[str, object] = {
        "tenant": request.tenant,
        "model": model,
        "messages": [[m.role, m.content] for m in request.messages],
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
