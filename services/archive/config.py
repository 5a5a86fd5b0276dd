"""archive settings (env prefix LLMBUS_ARCHIVE_)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from llmbus.archive.layout import default_root


class ArchiveSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_ARCHIVE_", extra="ignore")

    dir: Path = Field(default_factory=default_root)  # the archive's root directory (a volume in the shipped stacks)
    local: bool = True  # write the directory; False: the bucket only (then s3_uri is required)
    # s3://<bucket>/<prefix>/: the same files and manifests written to an S3-compatible bucket too (or only,
    # with local=false); the store's endpoint and keys are LLMBUS_S3_* (llmbus.settings.ObjectStoreSettings)
    s3_uri: str | None = None
    prompts: bool = True  # archive llm.requests too (the prompts `llmbus export rlhf` joins); False: never a prompt
    batch_max_records: int = 5000  # records per batch, so per Parquet file at most
    fetch_max_wait_ms: int = 2000  # the broker holds a fetch this long to fill it: fewer, larger files
    fetch_min_bytes: int = 256 * 1024
    id_cache_dirs: int = 256  # day/tenant directories whose record ids are kept in memory for dedupe
    orphan_age_s: float = 600.0  # at start, a `.tmp` no manifest names and older than this is removed
    compression: str = "zstd"

    @model_validator(mode="after")
    def _a_target(self) -> ArchiveSettings:
        if not self.local and not self.s3_uri:
            raise ValueError("the archive needs a target: LLMBUS_ARCHIVE_LOCAL=true or LLMBUS_ARCHIVE_S3_URI")
        if self.s3_uri and not self.s3_uri.startswith("s3://"):
            raise ValueError(f"LLMBUS_ARCHIVE_S3_URI {self.s3_uri!r}: expected s3://<bucket>/<prefix>/")
        return self
