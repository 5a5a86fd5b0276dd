"""An S3-compatible object store: the calls llmbus makes, each bounded, each failure one error type.

The client is minio-py (Apache-2.0), which speaks the S3 API (signature v4) to any endpoint: the local
S3Proxy of deploy/objectstore, AWS S3, Ceph RGW, SeaweedFS, ... Connecting and every read of a response
have timeouts (`ObjectStoreSettings`); a request that fails on the connection or with a 5xx is retried
by the HTTP pool with backoff. Whatever still fails raises ObjectStoreError (an OSError, so a caller that
holds work on an I/O error — the archive — holds it here too); a missing key or bucket raises ObjectMissing.
"""

from __future__ import annotations

import contextlib
import io
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import certifi
import urllib3
from minio import Minio
from minio.commonconfig import CopySource
from minio.deleteobjects import DeleteObject
from minio.error import MinioException, S3Error

from llmbus.settings import MIB, ObjectStoreSettings

READ_CHUNK_BYTES = 1 * MIB
MISSING_CODES = {"NoSuchKey", "NoSuchBucket", "NoSuchUpload", "NotFound"}


class ObjectStoreError(OSError):
    """A store call failed (unreachable, timed out, refused) after the pool's retries."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class ObjectMissing(ObjectStoreError):
    """The key (or its bucket) is not in the store."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size_bytes: int
    etag: str  # changes when the object is written again: a resumed download checks it
    modified_s: float = 0.0  # when it was last written (epoch seconds)


@contextlib.contextmanager
def _store_call(what: str) -> Iterator[None]:
    """Turn the client's and the HTTP pool's failures into ObjectStoreError / ObjectMissing."""
    try:
        yield
    except S3Error as exc:
        cls = ObjectMissing if exc.code in MISSING_CODES else ObjectStoreError
        raise cls(f"{what}: {exc.code}: {exc.message}", exc.code or "") from exc
    except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
        if isinstance(exc, ObjectStoreError):
            raise
        raise ObjectStoreError(f"{what}: {type(exc).__name__}: {exc}") from exc


class ObjectStore:
    """One client per process (thread-safe: the pool is shared)."""

    def __init__(self, settings: ObjectStoreSettings | None = None) -> None:
        self.settings = settings or ObjectStoreSettings()
        endpoint = urlsplit(self.settings.endpoint)
        if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
            raise ValueError(f"LLMBUS_S3_ENDPOINT {self.settings.endpoint!r}: expected http(s)://host:port")
        access_key, secret_key = self.settings.keys()
        ssl_context = None
        if endpoint.scheme == "https":
            ssl_context = ssl.create_default_context(cafile=self.settings.ca_file or certifi.where())
        http = urllib3.PoolManager(
            num_pools=4,
            maxsize=16,
            ssl_context=ssl_context,
            timeout=urllib3.Timeout(connect=self.settings.connect_timeout_s, read=self.settings.read_timeout_s),
            retries=urllib3.Retry(
                total=self.settings.retries,
                backoff_factor=0.5,
                status_forcelist=(500, 502, 503, 504),
                allowed_methods=None,  # uploads too: a part or a PUT sent again writes the same bytes
                raise_on_status=False,  # the last 5xx reaches minio, which raises it with the store's reason
            ),
        )
        self.client = Minio(
            endpoint.netloc,
            access_key=access_key,
            secret_key=secret_key,
            secure=endpoint.scheme == "https",
            region=self.settings.region,
            http_client=http,
        )

    def ensure_bucket(self, bucket: str) -> None:
        with _store_call(f"create bucket {bucket}"):
            if not self.client.bucket_exists(bucket):
                with contextlib.suppress(S3Error):  # another process made it meanwhile
                    self.client.make_bucket(bucket, location=self.settings.region)
            if not self.client.bucket_exists(bucket):
                raise ObjectStoreError(f"bucket {bucket} could not be created")

    def remove_bucket(self, bucket: str) -> None:
        """The bucket and every object in it (tests' buckets)."""
        with _store_call(f"remove bucket {bucket}"):
            if not self.client.bucket_exists(bucket):
                return
            self.delete(bucket, [info.key for info in self.objects(bucket)])
            self.client.remove_bucket(bucket)

    def put_file(self, bucket: str, key: str, path: Path) -> ObjectInfo:
        """Upload a file: multipart above `part_size_bytes` (parts sent three at a time)."""
        with _store_call(f"put s3://{bucket}/{key}"):
            self.client.fput_object(
                bucket, key, str(path), part_size=self.settings.part_size_bytes, num_parallel_uploads=3
            )
        return self.stat(bucket, key)

    def put_bytes(self, bucket: str, key: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        with _store_call(f"put s3://{bucket}/{key}"):
            self.client.put_object(bucket, key, io.BytesIO(data), len(data), content_type=content_type)

    def get_bytes(self, bucket: str, key: str) -> bytes:
        with self.stream(bucket, key) as chunks:
            return b"".join(chunks)

    @contextlib.contextmanager
    def stream(self, bucket: str, key: str, offset: int = 0) -> Iterator[Iterator[bytes]]:
        """The object's bytes from `offset` on (one ranged GET), in chunks; each read bounded by the read timeout."""
        with _store_call(f"get s3://{bucket}/{key}"):
            response = self.client.get_object(bucket, key, offset=offset)
        try:

            def chunks() -> Iterator[bytes]:
                with _store_call(f"read s3://{bucket}/{key}"):
                    yield from response.stream(READ_CHUNK_BYTES)

            yield chunks()
        finally:
            response.close()
            response.release_conn()

    def stat(self, bucket: str, key: str) -> ObjectInfo:
        with _store_call(f"stat s3://{bucket}/{key}"):
            found = self.client.stat_object(bucket, key)
        modified_s = found.last_modified.timestamp() if found.last_modified else 0.0
        return ObjectInfo(key, found.size or 0, (found.etag or "").strip('"'), modified_s)

    def objects(self, bucket: str, prefix: str = "") -> list[ObjectInfo]:
        """Every object under `prefix` (recursively), in key order."""
        with _store_call(f"list s3://{bucket}/{prefix}"):
            found = self.client.list_objects(bucket, prefix=prefix or None, recursive=True)
            return [
                ObjectInfo(
                    obj.object_name or "",
                    obj.size or 0,
                    (obj.etag or "").strip('"'),
                    obj.last_modified.timestamp() if obj.last_modified else 0.0,
                )
                for obj in found
                if not obj.is_dir
            ]

    def copy(self, bucket: str, source_key: str, key: str) -> None:
        """A server-side copy within the bucket (no bytes through this process)."""
        with _store_call(f"copy s3://{bucket}/{source_key} to {key}"):
            self.client.copy_object(bucket, key, CopySource(bucket, source_key))

    def delete(self, bucket: str, keys: list[str]) -> None:
        if not keys:
            return
        with _store_call(f"delete {len(keys)} objects in s3://{bucket}"):
            errors = list(self.client.remove_objects(bucket, [DeleteObject(key) for key in keys]))
        if errors:
            raise ObjectStoreError(f"delete in s3://{bucket}: {errors[0].code}: {errors[0].message}")
