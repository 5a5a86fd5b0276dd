"""A worker's choice among a model version's artifacts, its plan, its cold-start phases, the failure codes."""

from __future__ import annotations

import pytest

from llmbus.artifacts import ArtifactCorrupt, ObjectStoreError
from llmbus.artifacts.locks import LockTimeout
from llmbus.contract.messages import GpuInfo, ModelSpec, NodeProfile
from llmbus.contract.messages.artifacts import ArtifactFile, ModelArtifact
from llmbus_services.engine_worker.adapters.model_fetch import failure_reason
from llmbus_services.engine_worker.adapters.model_source import given_artifacts
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.artifacts import (
    UnknownModelVersion,
    artifacts_of,
    choose_artifact,
    with_fetch_phases,
    with_local_path,
)
from llmbus_services.engine_worker.core.formats import NoFormatFits
from llmbus_services.engine_worker.core.node_plan import NodePlan, plan_for

GIB = 1024**3


def artifact(fmt: str, gib: float, quantization: str | None = None) -> ModelArtifact:
    weights = ArtifactFile(path="model.safetensors", sha256="a" * 64, size_bytes=int(gib * GIB))
    return ModelArtifact(format=fmt, quantization=quantization, uri=f"s3://models/llama-8b/3/{fmt}/", files=[weights])


VERSION = [artifact("bf16", 16), artifact("fp8", 8, "fp8-e4m3"), artifact("awq", 5, "awq-int4"), artifact("fp32", 32)]


def gpu_node(cc: str, free_gib: float) -> NodeProfile:
    gpu = GpuInfo(
        index=0,
        name="GPU",
        uuid="GPU-1",
        memory_total_bytes=80 * GIB,
        memory_free_bytes=int(free_gib * GIB),
        compute_capability=cc,
    )
    return NodeProfile(node_id="n1", hostname="h", kind="gpu", gpus=[gpu])


def cpu_node(free_gib: float) -> NodeProfile:
    return NodeProfile(node_id="n1", hostname="h", kind="cpu", memory_free_bytes=int(free_gib * GIB))


def base_plan(profile: NodeProfile, engine: str = "vllm") -> NodePlan:
    return plan_for(WorkerSettings(engine=engine, model="llama-8b", model_version="3"), profile, None)


def test_a_gpu_node_takes_the_best_format_that_fits_085_of_free_vram() -> None:
    chosen, plan = choose_artifact(base_plan(gpu_node("9.0", 70)), gpu_node("9.0", 70), VERSION)
    assert chosen.format == "bf16" and plan.settings.vllm_dtype == "bfloat16"
    small = gpu_node("8.9", 12)  # 10.2 GB usable: bf16 does not fit, fp8 does
    chosen, plan = choose_artifact(base_plan(small), small, VERSION)
    assert chosen.format == "fp8" and plan.settings.vllm_quantization == "fp8"
    with pytest.raises(NoFormatFits, match="awq"):
        choose_artifact(base_plan(gpu_node("8.6", 4)), gpu_node("8.6", 4), VERSION)


def test_a_cpu_node_takes_a_cpu_format_that_fits_its_memory() -> None:
    chosen, plan = choose_artifact(base_plan(cpu_node(64)), cpu_node(64), VERSION)
    assert chosen.format == "fp32" and plan.settings.vllm_dtype == "float32" and plan.model_format == "fp32"
    chosen, plan = choose_artifact(base_plan(cpu_node(24)), cpu_node(24), VERSION)  # 20.4 GB usable
    assert chosen.format == "bf16" and plan.settings.vllm_dtype == "bfloat16"
    with pytest.raises(NoFormatFits, match=r"fp8: not a CPU format; awq: not a CPU format"):
        choose_artifact(base_plan(cpu_node(64)), cpu_node(64), [VERSION[1], VERSION[2]])


def test_the_fetched_directory_becomes_the_engines_model_path() -> None:
    chosen, plan = choose_artifact(base_plan(gpu_node("8.9", 12)), gpu_node("8.9", 12), VERSION)
    loaded = with_local_path(plan, chosen, "/var/cache/llmbus/artifacts/1d60")
    assert loaded.settings.vllm_model_path == "/var/cache/llmbus/artifacts/1d60"
    assert loaded.model_format == "fp8" and loaded.settings.vllm_quantization == "fp8"


def test_fetch_and_verify_are_carved_out_of_startup() -> None:
    engine = {"startup": 9.5, "import": 14.0, "engine_process": 13.0, "warmup": 0.2}
    phases = with_fetch_phases(engine, fetch_s=7.25, verify_s=1.5)
    assert list(phases) == ["startup", "fetch", "verify", "import", "engine_process", "warmup"]
    assert phases["startup"] == 0.75 and sum(phases.values()) == pytest.approx(sum(engine.values()))


def test_the_registry_record_of_a_version_gives_its_artifacts() -> None:
    class VersionRecord(ModelSpec):  # what the registry's per-version record adds: its artifacts
        artifacts: list[ModelArtifact] = []

    table: dict[str, ModelSpec] = {"llama-8b@3": VersionRecord(name="llama-8b", version="3", artifacts=VERSION)}
    assert artifacts_of(table, "llama-8b", "3") == VERSION
    with pytest.raises(UnknownModelVersion, match=r"llama-8b@4 is not in the registry"):
        artifacts_of(table, "llama-8b", "4")
    with pytest.raises(UnknownModelVersion, match="lists no artifacts"):
        artifacts_of({"llama-8b": ModelSpec(name="llama-8b", version="3")}, "llama-8b", "3")


def test_artifacts_given_directly_as_json() -> None:
    assert given_artifacts(VERSION[0].model_dump_json()) == [VERSION[0]]
    listed = "[" + ",".join(a.model_dump_json() for a in VERSION[:2]) + "]"
    assert given_artifacts(listed) == VERSION[:2]
    with pytest.raises(ValueError, match="s3://<bucket>/<prefix>/ or file:///<dir>/"):
        given_artifacts("http://example/model/")


def test_model_ref_names_the_model_and_its_version() -> None:
    ws = WorkerSettings(model_ref="llama-8b@3")
    assert (ws.model, ws.model_version) == ("llama-8b", "3")
    with pytest.raises(ValueError, match="expected NAME@VERSION"):
        WorkerSettings(model_ref="llama-8b")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ArtifactCorrupt("model.safetensors: sha256 9f, the artifact lists 0b"), "artifact_digest_mismatch"),
        (NoFormatFits("no artifact runs on this CPU node"), "no_artifact_fits"),
        (UnknownModelVersion("llama-8b@4 is not in the registry"), "model_version_unknown"),
        (LockTimeout("still locked"), "artifact_download_wait"),
        (ObjectStoreError("connection refused"), "artifact_store_unavailable"),
        (ValueError("bad JSON"), "artifact_config_invalid"),
    ],
)
def test_a_failed_start_names_its_code_first(error: Exception, code: str) -> None:
    assert failure_reason(error).startswith(f"{code}: ")
