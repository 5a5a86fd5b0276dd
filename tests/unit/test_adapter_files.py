"""A LoRA adapter's directory on the worker: a local source as it is; an object-store root fetched into the
node's cache and verified, once; a missing, resized or corrupt artifact a final error of the request, a store
that does not answer a retryable one (never the worker's crash)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmbus.artifacts import ArtifactCache, CacheSettings, ObjectMissing, ObjectStoreError, push_directory
from llmbus.artifacts.store import ObjectInfo
from llmbus.contract.messages import ErrorCode, LoraAdapter
from llmbus_services.engine_worker.adapters.adapter_files import (
    AdapterFetchFailed,
    AdapterFiles,
    AdapterUnavailable,
)
from llmbus_services.engine_worker.core.engine import RequestRejected

ROOT = "s3://adapters/tiny-ops/1/lora/"


class FakeStore:
    """The ObjectStore calls a push and a fetch make, over a dict; `gets` counts the objects read."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}
        self.gets = 0
        self.down = False

    def ensure_bucket(self, bucket: str) -> None:
        pass

    def put_file(self, bucket: str, key: str, path: Path) -> ObjectInfo:
        self.objects[bucket, key] = path.read_bytes()
        return self.stat(bucket, key)

    def put_bytes(self, bucket: str, key: str, data: bytes, content_type: str = "") -> None:
        self.objects[bucket, key] = data

    def get_bytes(self, bucket: str, key: str) -> bytes:
        with self.stream(bucket, key) as chunks:
            return b"".join(chunks)

    def stat(self, bucket: str, key: str) -> ObjectInfo:
        data = self._object(bucket, key)
        return ObjectInfo(key, len(data), hashlib.md5(data).hexdigest())

    @contextlib.contextmanager
    def stream(self, bucket: str, key: str, offset: int = 0) -> Iterator[Iterator[bytes]]:
        self.gets += 1
        yield iter([self._object(bucket, key)[offset:]])

    def _object(self, bucket: str, key: str) -> bytes:
        if self.down:
            raise ObjectStoreError(f"s3://{bucket}/{key}: connection refused")
        if (bucket, key) not in self.objects:
            raise ObjectMissing(f"s3://{bucket}/{key}: NoSuchKey", "NoSuchKey")
        return self.objects[bucket, key]


def adapter_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "tiny-ops"
    directory.mkdir()
    (directory / "adapter_config.json").write_text('{"r": 8, "peft_type": "LORA"}')
    (directory / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 64)
    return directory


def pushed(tmp_path: Path) -> tuple[FakeStore, AdapterFiles, LoraAdapter]:
    store = FakeStore()
    push_directory(adapter_dir(tmp_path), ROOT, format="lora", store=store)  # type: ignore[arg-type]
    cache = ArtifactCache(CacheSettings(dir=tmp_path / "cache", store_retry_s=0))
    files = AdapterFiles(cache=lambda: cache, store=lambda: store)  # type: ignore[arg-type,return-value]
    return store, files, LoraAdapter(name="tiny-ops", base_model="tiny-llama", source=ROOT, rank=8)


async def test_an_object_store_adapter_is_fetched_into_the_cache_once_and_verified(tmp_path: Path) -> None:
    store, files, adapter = pushed(tmp_path)
    first, second = await asyncio.gather(files.directory(adapter), files.directory(adapter))
    assert first == second and Path(first).parent == tmp_path / "cache"
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (Path(first) / name).read_bytes() == (tmp_path / "tiny-ops" / name).read_bytes()
    reads = store.gets  # the manifest and two files, once: the second request waited for the first's fetch
    assert reads == 3
    assert await files.directory(adapter) == first and store.gets == reads
    files.close()


@pytest.mark.parametrize(
    ("damage", "code"),
    [
        (lambda data: bytes([data[0] ^ 1]) + data[1:], "artifact_digest_mismatch"),  # same size, other bytes
        (lambda data: data[:-10], "artifact_size_mismatch"),
        (None, "artifact_missing"),
    ],
)
async def test_a_corrupt_or_missing_adapter_artifact_is_a_final_error_of_the_request(
    tmp_path: Path, damage: object, code: str
) -> None:
    store, files, adapter = pushed(tmp_path)
    key = ("adapters", "tiny-ops/1/lora/adapter_model.safetensors")
    if damage is None:
        del store.objects[key]
    else:
        store.objects[key] = damage(store.objects[key])  # type: ignore[operator]
    with pytest.raises(AdapterUnavailable) as refused:
        await files.directory(adapter)
    error = refused.value
    assert error.code == ErrorCode.MODEL_UNAVAILABLE and not error.retryable
    assert code in str(error) and "tiny-ops" in str(error) and ROOT in str(error)
    assert not list((tmp_path / "cache").glob("*/adapter_model.safetensors"))  # nothing unverified is loaded


async def test_a_root_without_an_artifact_or_an_adapter_config_is_a_final_error(tmp_path: Path) -> None:
    store, files, adapter = pushed(tmp_path)
    elsewhere = adapter.model_copy(update={"source": "s3://adapters/nothing/"})
    with pytest.raises(AdapterUnavailable, match="artifact_missing"):
        await files.directory(elsewhere)
    not_an_adapter = tmp_path / "weights"
    not_an_adapter.mkdir()
    (not_an_adapter / "model.safetensors").write_bytes(b"\x00" * 64)
    push_directory(not_an_adapter, "s3://adapters/weights/", format="lora", store=store)  # type: ignore[arg-type]
    with pytest.raises(AdapterUnavailable, match=r"no adapter_config\.json"):
        await files.directory(adapter.model_copy(update={"source": "s3://adapters/weights/"}))


async def test_a_store_that_does_not_answer_is_retryable_elsewhere(tmp_path: Path) -> None:
    store, files, adapter = pushed(tmp_path)
    store.down = True
    with pytest.raises(AdapterFetchFailed) as failed:
        await files.directory(adapter)
    assert failed.value.retryable and failed.value.code == ErrorCode.WORKER_ERROR
    store.down = False
    assert (Path(await files.directory(adapter)) / "adapter_config.json").is_file()  # the next request fetches it


async def test_a_local_adapter_is_used_where_it_is(tmp_path: Path) -> None:
    directory = adapter_dir(tmp_path)
    files = AdapterFiles(store=lambda: pytest.fail("no store for a local adapter"))  # type: ignore[arg-type,return-value]
    for source in (str(directory), directory.as_uri()):
        adapter = LoraAdapter(name="tiny-ops", base_model="tiny-llama", source=source)
        assert await files.directory(adapter) == str(directory)
    with pytest.raises(RequestRejected, match=r"no adapter_config\.json"):
        await files.directory(adapter.model_copy(update={"source": str(tmp_path)}))
    with pytest.raises(RequestRejected, match="file:// or s3://"):
        await files.directory(adapter.model_copy(update={"source": "hf://org/adapter"}))
