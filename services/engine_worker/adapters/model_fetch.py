"""The start-up step that fetches the model, before the engine is built: resolve the version's artifacts,
choose the one this node runs, fetch and verify it into the node's cache, and give the engine its directory.

While it runs, heartbeats say STARTING and what is being done (`state_reason`: "fetch fp32 ...: 0.4 of
1.9 GB"). A start that cannot serve (a corrupt, missing or resized artifact, no artifact for this node,
an unknown version, the store unreachable past the retry budget) ends here: a FAILED heartbeat whose
`state_reason` starts with the error's code, one error log line, and exit code 3 (EXIT_START_FAILED), so
the worker never reports ready and its supervisor sees the failure. `fetch` and `verify` are cold-start
phases (heartbeats, then cost records) and child spans of this step's span.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from opentelemetry import trace

from llmbus.artifacts import ArtifactCache, ArtifactError, ObjectStore, ObjectStoreError, Progress, fetch_artifact
from llmbus.artifacts.locks import FileLock, LockTimeout
from llmbus.bus import Bus
from llmbus.contract import semconv
from llmbus.contract import topics as t
from llmbus.contract.messages import NodeProfile, WorkerState, WorkerStatus
from llmbus.process.periodic import run_every
from llmbus.settings import BusSettings
from llmbus_services.engine_worker.adapters.model_source import artifacts_to_serve
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.artifacts import (
    UnknownModelVersion,
    choose_artifact,
    with_fetch_phases,
    with_local_path,
)
from llmbus_services.engine_worker.core.formats import NoFormatFits
from llmbus_services.engine_worker.core.node_plan import NodePlan

log = logging.getLogger(__name__)
tracer = trace.get_tracer("llmbus.engine_worker")

EXIT_START_FAILED = 3
# Failures that are not ArtifactErrors, by the code their reason starts with.
FAILURE_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (NoFormatFits, "no_artifact_fits"),
    (UnknownModelVersion, "model_version_unknown"),
    (LockTimeout, "artifact_download_wait"),  # another worker of the node downloaded it for too long
    (ObjectStoreError, "artifact_store_unavailable"),
    (ValueError, "artifact_config_invalid"),  # settings: the JSON, the URI, the store's credentials
)


@dataclass
class PreparedModel:
    plan: NodePlan
    fetch_s: float = 0.0
    verify_s: float = 0.0
    lease: FileLock | None = None  # the cache entry, held while the process lives

    def phases(self, phases: dict[str, float]) -> dict[str, float]:
        """The worker's cold-start phases with `fetch` and `verify` in their place (when it fetched)."""
        return with_fetch_phases(phases, self.fetch_s, self.verify_s) if self.lease else phases


def failure_reason(exc: BaseException) -> str:
    if isinstance(exc, ArtifactError):
        return str(exc)
    code = next((code for kind, code in FAILURE_CODES if isinstance(exc, kind)), "start_failed")
    return f"{code}: {exc}"


async def prepare_model(
    bus: Bus, ws: WorkerSettings, settings: BusSettings, profile: NodeProfile, plan: NodePlan, started_at_ms: int
) -> PreparedModel:
    """The plan with the fetched artifact's directory; the plan as it is when nothing is to be fetched."""
    if not (ws.model_ref or ws.artifacts):
        return PreparedModel(plan)
    reporter = StartReporter(bus, ws, started_at_ms)
    beats = asyncio.create_task(run_every(ws.heartbeat_interval_s, reporter.beat, name="start heartbeat", at_once=True))
    attributes = {semconv.LLMBUS_WORKER_ID: ws.worker_id, semconv.GEN_AI_REQUEST_MODEL: ws.model}
    with tracer.start_as_current_span("engine-worker fetch model", attributes=attributes) as span:
        try:
            artifacts = await artifacts_to_serve(ws, settings)
            artifact, chosen = choose_artifact(plan, profile, artifacts)
            reporter.describe(artifact.format, artifact.uri)
            store = ObjectStore() if artifact.uri.startswith("s3://") else None
            fetched = await asyncio.to_thread(
                fetch_artifact, artifact, ArtifactCache(), store=store, progress=reporter.progress
            )
        except (ArtifactError, ValueError, UnknownModelVersion, OSError, TimeoutError) as exc:
            reason = failure_reason(exc)
            log.error("start failed, the worker will not serve: %s", reason)
            span.set_status(trace.StatusCode.ERROR, reason)
            span.record_exception(exc)
            beats.cancel()
            await reporter.failed(reason)
            raise SystemExit(EXIT_START_FAILED) from exc
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
        span.set_attributes(
            {
                semconv.LLMBUS_MODEL_VERSION: ws.model_version,
                semconv.LLMBUS_MODEL_FORMAT: artifact.format,
                semconv.LLMBUS_ARTIFACT_URI: artifact.uri,
                semconv.LLMBUS_ARTIFACT_BYTES: artifact.size_bytes,
                semconv.LLMBUS_ARTIFACT_DOWNLOADED_BYTES: fetched.downloaded_bytes,
                semconv.LLMBUS_ARTIFACT_CACHE_HIT: fetched.cache_hit,
            }
        )
        ended_ns = time.time_ns()
        _phase_span("fetch", ended_ns - round((fetched.fetch_s + fetched.verify_s) * 1e9), fetched.fetch_s)
        _phase_span("verify", ended_ns - round(fetched.verify_s * 1e9), fetched.verify_s)
    log.info(
        "model %s@%s: %s from %s in %s (%.2fs fetch, %.2fs verify, %d bytes downloaded)",
        ws.model, ws.model_version, artifact.format, artifact.uri, fetched.path,
        fetched.fetch_s, fetched.verify_s, fetched.downloaded_bytes,
    )  # fmt: skip
    return PreparedModel(
        with_local_path(chosen, artifact, str(fetched.path)), fetched.fetch_s, fetched.verify_s, fetched.lease
    )


def _phase_span(phase: str, start_ns: int, duration_s: float) -> None:
    """A child span for a phase the fetch timed (it ran in a thread, as one call)."""
    span = tracer.start_span(
        f"cold start {phase}", start_time=start_ns, attributes={semconv.LLMBUS_COLD_START_PHASE: phase}
    )
    span.end(end_time=start_ns + round(duration_s * 1e9))


class StartReporter:
    """Heartbeats of a worker that has no engine yet: STARTING with what it is doing, or FAILED with why."""

    def __init__(self, bus: Bus, ws: WorkerSettings, started_at_ms: int) -> None:
        self.bus, self.ws, self.started_at_ms = bus, ws, started_at_ms
        self.progress = Progress()
        self.model_format: str | None = None
        self.doing = "resolving the model's artifacts"

    def describe(self, model_format: str, uri: str) -> None:
        self.model_format, self.doing = model_format, f"{model_format} from {uri}"

    async def beat(self) -> None:
        await self._publish(WorkerState.STARTING, self._doing())

    async def failed(self, reason: str) -> None:
        await self._publish(WorkerState.FAILED, reason)

    def _doing(self) -> str:
        p = self.progress
        if not p.total_bytes:
            return self.doing
        return f"{p.phase} {self.doing}: {p.done_bytes / 1e9:.2f} of {p.total_bytes / 1e9:.2f} GB"

    async def _publish(self, state: WorkerState, reason: str) -> None:
        status = WorkerStatus(
            worker_id=self.ws.worker_id,
            node_id=self.ws.node_id,
            state=state,
            state_reason=reason,
            engine=self.ws.engine,
            models=[self.ws.model],
            model_version=self.ws.model_version,
            model_format=self.model_format,
            started_at_ms=self.started_at_ms,
        )
        await self.bus.publisher.publish(self.bus.topics.name(t.WORKERS), status, key=self.ws.worker_id)
