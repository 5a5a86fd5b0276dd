"""What a vLLM or torch failure means for the worker: an OOM, a dead engine core, a request vLLM refuses
(final, with the parameter vLLM names), or a failure to retry elsewhere while the engine serves on."""

from __future__ import annotations

from llmbus_services.engine_worker.core.engine import EngineDead, EngineError, EngineOOM, RequestRejected

_OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda error: out of memory", "no available memory for the cache")


def classify_error(exc: BaseException) -> EngineError:
    """Turn a vLLM / torch failure into the error the worker reports.

    Only OOM and a dead engine core restart the engine; validation errors are final for the
    request; anything else is retried elsewhere while the engine keeps serving the others.
    """
    if isinstance(exc, EngineError):
        return exc
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    text = " | ".join(f"{type(e).__name__}: {e}" for e in chain)
    if any(type(e).__name__ == "OutOfMemoryError" for e in chain) or any(m in text.lower() for m in _OOM_MARKERS):
        return EngineOOM(f"engine out of memory: {text}")
    if any(type(e).__name__ == "EngineDeadError" for e in chain):
        return EngineDead(f"vLLM engine core is dead: {text}")
    if refused := [e for e in chain if type(e).__name__ in ("VLLMValidationError", "VLLMClientError")]:
        # The same request fails everywhere; vLLM names the parameter it refused, where it knows it.
        return RequestRejected(f"vLLM refused the request: {text}", getattr(refused[0], "parameter", None))
    return EngineError(f"vLLM generate failed: {text}")  # retried elsewhere; the engine lives on
