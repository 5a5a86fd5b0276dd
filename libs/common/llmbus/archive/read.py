"""Read the archive back: one kind's rows from a day on, for a tenant or all, each record id once.

The archive writes every record id once (services/archive); a reader dedupes all the same (the
first by source offset wins), so a directory copied or merged by hand reads as if written once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from llmbus.archive.layout import DATA_SUFFIX, safe
from llmbus.archive.rows import SCHEMA


def data_files(root: Path, kind: str, since_day: str | None = None, tenant: str | None = None) -> list[Path]:
    """The kind's finished files (never a `.tmp`) in day order, from `since_day` (YYYY-MM-DD) on."""
    tenant_glob = f"tenant={safe(tenant)}" if tenant is not None else "tenant=*"
    files = []
    for path in sorted((root / kind).glob(f"day=*/{tenant_glob}/*{DATA_SUFFIX}")):
        day = path.parent.parent.name.removeprefix("day=")
        if since_day is None or day >= since_day:
            files.append(path)
    return files


def read_table(root: Path, kind: str, since_day: str | None = None, tenant: str | None = None) -> pa.Table:
    files = data_files(root, kind, since_day, tenant)
    if not files:
        return SCHEMA.empty_table()
    return pa.concat_tables(pq.read_table(path, schema=SCHEMA) for path in files)


def read_rows(root: Path, kind: str, since_day: str | None = None, tenant: str | None = None) -> list[dict[str, Any]]:
    """Rows as dicts with the message decoded into `message` (JSON), each record id once."""
    rows = sorted(
        read_table(root, kind, since_day, tenant).to_pylist(), key=lambda r: (r["topic"], r["partition"], r["offset"])
    )
    seen: set[str] = set()
    out = []
    for row in rows:
        if row["record_id"] in seen:
            continue
        seen.add(row["record_id"])
        row["message"] = json.loads(row.pop("payload"))
        out.append(row)
    return out
