"""LoRA adapters on the real vLLM CPU engine: two tiny random-weight adapters made with `peft` on the tiny Llama,
loaded on demand, a second one evicting the first under a slot limit of 1, and both served through the gateway
(router, scheduler, engine-worker) with the official `openai` SDK, named as the model or beside the base model.
A third adapter is pushed to the object store and registered from its manifest by the CLI's own functions, then
served: the worker fetches it into its node's cache and verifies it; one corrupted in the store is refused.

Greedy answers (temperature 0, EOS ignored) are compared: each adapter's answer differs from the base model's
and from the other's, and the gateway's answer for an adapter is the engine's own answer with that adapter.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from llmbus.artifacts import ObjectStore
from llmbus.bus.tables import read_table
from llmbus.cli import models as models_cli
from llmbus.contract import topics as t
from llmbus.contract.messages import ChatMessage, InferenceRequest, LoraAdapter, ModelSpec, WorkerStatus
from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from llmbus_services.engine_worker.core.engine import EngineRequest
from llmbus_tools.harness.tiny_llama import build_tiny_llama
from llmbus_tools.harness.tiny_lora import build_tiny_lora
from llmbus_tools.harness.vllm_config import tiny_vllm_config
from tests.fixtures.vllm_engine import _set_env, running
from tests.fixtures.vllm_gateway import VllmGateway, vllm_gateway

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.redis,
    pytest.mark.vllm,
    pytest.mark.objectstore,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.asyncio(loop_scope="session"),
]

BASE = "tiny-llama"
ANSWER_TOKENS = 6
CHAT = [{"role": "user", "content": "which broker holds the topic partition offset?"}]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LoraAdapter]:
    root = tmp_path_factory.mktemp("lora")
    base = build_tiny_llama()
    built = {}
    for name, seed in (("tiny-sql", 1), ("tiny-chat", 2)):
        path = build_tiny_lora(base, root / name, seed=seed, rank=8)
        built[name] = LoraAdapter(name=name, base_model=BASE, source=f"file://{path}", rank=8)
    return built


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def lora_engine() -> AsyncIterator[VllmEngine]:
    """The tiny Llama with adapters enabled: one slot (max_loras = max_cpu_loras = 1), ranks up to 8."""
    _set_env()
    config = tiny_vllm_config(model=BASE, max_loras=1, max_cpu_loras=1, max_lora_rank=8, warmup_iterations=1)
    async with running(config) as engine:
        yield engine


async def answer(engine: VllmEngine, adapter: LoraAdapter | None, request_id: str) -> str:
    messages = tuple(ChatMessage.model_validate(m) for m in CHAT)
    request = EngineRequest(
        request_id=request_id,
        prompt=InferenceRequest(messages=list(messages)).prompt_text(),
        max_tokens=ANSWER_TOKENS,
        temperature=0.0,
        messages=messages,
        adapter=adapter,
    )
    return "".join([out.delta async for out in engine.generate(request)])


async def vllm_loaded(engine: VllmEngine) -> set[int]:
    return set(await engine._llm.list_loras())  # vLLM's own record of what its adapter cache holds


async def test_adapters_load_on_demand_and_a_second_evicts_the_first_under_one_slot(
    lora_engine: VllmEngine, adapters: dict[str, LoraAdapter]
) -> None:
    sql, chat = adapters["tiny-sql"], adapters["tiny-chat"]
    assert lora_engine.lora is not None and lora_engine.lora.loaded == [] and await vllm_loaded(lora_engine) == set()
    base_text = await answer(lora_engine, None, "base-1")

    sql_text = await answer(lora_engine, sql, "sql-1")
    assert lora_engine.lora.loaded == ["tiny-sql"] and await vllm_loaded(lora_engine) == {1}

    chat_text = await answer(lora_engine, chat, "chat-1")
    assert lora_engine.lora.loaded == ["tiny-chat"] and await vllm_loaded(lora_engine) == {2}  # tiny-sql evicted
    assert len({base_text, sql_text, chat_text}) == 3, (base_text, sql_text, chat_text)

    again = await answer(lora_engine, sql, "sql-2")  # loaded again, evicting tiny-chat
    assert again == sql_text
    assert lora_engine.lora.loaded == ["tiny-sql"] and await vllm_loaded(lora_engine) == {1}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def gateway(
    lora_engine: VllmEngine, adapters: dict[str, LoraAdapter], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[VllmGateway]:
    models = [ModelSpec(name=BASE, max_model_len=512, max_output_tokens=64)] + [
        ModelSpec(name=a.name, max_model_len=512, max_output_tokens=64, lora=a) for a in adapters.values()
    ]
    async with vllm_gateway(lora_engine, Path(tmp_path_factory.mktemp("logs")), "vllm-lora", models) as stack:
        yield stack


async def heartbeat_adapters(gw: VllmGateway, want: list[str], timeout_s: float = 20) -> WorkerStatus:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        table = await read_table(gw.settings, t.Topics(gw.settings.topic_prefix).name(t.WORKERS), WorkerStatus)
        status = table.get("vllm-lora")
        if status is not None and status.lora_adapters == want:
            return status
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"heartbeat adapters: {status and status.lora_adapters}, wanted {want}")
        await asyncio.sleep(0.5)


async def test_the_sdk_reaches_an_adapter_by_its_name_and_as_base_plus_adapter(
    gateway: VllmGateway, lora_engine: VllmEngine, adapters: dict[str, LoraAdapter]
) -> None:
    client = gateway.sdk()
    listed = {m.id: m for m in (await client.models.list()).data}
    assert listed["tiny-sql"].model_extra is not None and listed["tiny-sql"].model_extra["parent"] == BASE

    by_name = await client.chat.completions.create(
        model="tiny-sql",
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=ANSWER_TOKENS,
        temperature=0,
    )
    assert by_name.model == "tiny-sql"
    status = await heartbeat_adapters(gateway, ["tiny-sql"])
    assert (status.max_loras, status.max_lora_rank, status.models) == (1, 8, [BASE])

    beside_base = await client.chat.completions.create(
        model=BASE,
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=ANSWER_TOKENS,
        temperature=0,
        extra_body={"adapter": "tiny-chat"},
    )
    assert beside_base.model == "tiny-chat"
    await heartbeat_adapters(gateway, ["tiny-chat"])  # one slot: the second adapter evicted the first

    plain = await client.chat.completions.create(
        model=BASE,
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=ANSWER_TOKENS,
        temperature=0,
    )
    # The engine's own answers with each adapter (and without), after the gateway's: its slot is the last used.
    expected = {
        "tiny-sql": await answer(lora_engine, adapters["tiny-sql"], "direct-sql"),
        "tiny-chat": await answer(lora_engine, adapters["tiny-chat"], "direct-chat"),
        BASE: await answer(lora_engine, None, "direct-base"),
    }
    assert by_name.choices[0].message.content == expected["tiny-sql"]
    assert beside_base.choices[0].message.content == expected["tiny-chat"]
    assert plain.choices[0].message.content == expected[BASE]
    assert len(set(expected.values())) == 3


async def test_an_adapter_the_catalog_lacks_is_refused_with_a_clear_error(gateway: VllmGateway) -> None:
    import openai

    with pytest.raises(openai.APIStatusError) as refused:
        await gateway.sdk().chat.completions.create(
            model=BASE,
            messages=CHAT,  # type: ignore[arg-type]
            max_tokens=2,
            extra_body={"adapter": "tiny-unknown"},
        )
    assert "tiny-unknown" in refused.value.message and "not in the catalog" in refused.value.message


def adapter_manifest(path: Path, name: str, seed: int) -> Path:
    body = {
        "name": name,
        "version": "1",
        "owner": "ml-platform",
        "adapter": {"base_model": BASE, "rank": 8},
        "context_length_tokens": 512,
        "max_output_tokens": 64,
        "lineage": {
            "training_data_version": "none (random weights)",
            "training_code_commit": "llmbus_tools/harness/tiny_lora.py",
            "hyperparameters": {"r": 8, "lora_alpha": 16, "seed": seed},
        },
    }
    path.write_text(yaml.safe_dump(body))
    return path


def push(adapter_dir: Path, manifest: Path, bucket: str) -> None:
    """`llmbus models push DIR --manifest M --to s3://BUCKET/`: the CLI's command function (run in a thread: it
    runs its own event loop), under the namespace LLMBUS_TOPIC_PREFIX names."""
    models_cli.models_push(adapter_dir, manifest, to=f"s3://{bucket}/", format=None, quantization=None, overrides=[])


def release_and_show(ref: str) -> str:
    """`llmbus models release NAME@1` (a first version serves at once), then what `llmbus models show` prints."""
    models_cli.models_release(ref, salt="")
    with models_cli.console.capture() as shown:
        models_cli.models_show(ref)
    return shown.get()


async def served(gw: VllmGateway, name: str, timeout_s: float = 30) -> None:
    """Until the gateway lists the newly registered model (it reads llm.models as it goes)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while name not in {m.id for m in (await gw.sdk().models.list()).data}:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{name} not listed by the gateway within {timeout_s}s")
        await asyncio.sleep(0.5)


async def test_an_adapter_pushed_to_the_object_store_and_registered_from_its_manifest_is_served(
    gateway: VllmGateway,
    lora_engine: VllmEngine,
    bucket: str,
    object_store: ObjectStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import openai

    monkeypatch.setenv("LLMBUS_TOPIC_PREFIX", gateway.settings.topic_prefix)
    models_cli.console.width = 220
    ops_dir = build_tiny_lora(build_tiny_llama(), tmp_path / "tiny-ops", seed=3, rank=8)
    manifest = adapter_manifest(tmp_path / "tiny-ops.yaml", "tiny-ops", seed=3)
    await asyncio.to_thread(push, ops_dir, manifest, bucket)
    shown = await asyncio.to_thread(release_and_show, "tiny-ops@1")
    assert "LoRA adapter of tiny-llama" in shown and f"s3://{bucket}/tiny-ops/1/lora/" in shown, shown
    assert "adapter_model.safetensors" in shown and "llmbus_tools/harness/tiny_lora.py" in shown

    record = (await read_table(gateway.settings, t.Topics(gateway.settings.topic_prefix).name(t.MODELS), ModelSpec))[
        "tiny-ops"
    ]
    assert record.record == "serving" and record.lora is not None
    assert record.lora.source == f"s3://{bucket}/tiny-ops/1/lora/" and record.lora.base_model == BASE
    assert record.lineage is not None and record.lineage.base_model == BASE
    assert {f.path for f in record.artifacts[0].files} >= {"adapter_config.json", "adapter_model.safetensors"}

    await served(gateway, "tiny-ops")
    client = gateway.sdk()
    answered = await client.chat.completions.create(
        model="tiny-ops",
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=ANSWER_TOKENS,
        temperature=0,
    )
    assert answered.model == "tiny-ops"
    await heartbeat_adapters(gateway, ["tiny-ops"])
    # The same weights loaded from their local directory, as another adapter: the fetched copy's answer.
    local = LoraAdapter(name="tiny-ops-local", base_model=BASE, source=f"file://{ops_dir}", rank=8)
    assert answered.choices[0].message.content == await answer(lora_engine, local, "direct-ops")
    assert answered.choices[0].message.content != await answer(lora_engine, None, "direct-base-ops")

    # A second adapter whose weights are damaged in the store after the push: the request ends with a clear,
    # final error; the worker lives on and serves the first adapter again.
    broken_dir = build_tiny_lora(build_tiny_llama(), tmp_path / "tiny-broken", seed=4, rank=8)
    broken = adapter_manifest(tmp_path / "tiny-broken.yaml", "tiny-broken", seed=4)
    await asyncio.to_thread(push, broken_dir, broken, bucket)
    key = "tiny-broken/1/lora/adapter_model.safetensors"
    weights = object_store.get_bytes(bucket, key)
    object_store.put_bytes(bucket, key, weights[:-1] + bytes([weights[-1] ^ 1]))  # same size, another digest
    await asyncio.to_thread(release_and_show, "tiny-broken@1")
    await served(gateway, "tiny-broken")
    with pytest.raises(openai.APIStatusError) as refused:
        await client.chat.completions.create(
            model="tiny-broken",
            messages=CHAT,  # type: ignore[arg-type]
            max_tokens=ANSWER_TOKENS,
        )
    assert refused.value.status_code == 503, refused.value.message
    assert "artifact_digest_mismatch" in refused.value.message and "tiny-broken" in refused.value.message
    again = await client.chat.completions.create(
        model="tiny-ops",
        messages=[{"role": "user", "content": "which consumer group reads the topic?"}],  # not a cached answer
        max_tokens=ANSWER_TOKENS,
        temperature=0,
    )
    assert again.model == "tiny-ops" and again.choices[0].message.content
    await heartbeat_adapters(gateway, ["tiny-ops"])  # loaded again, from the cache entry fetched before
