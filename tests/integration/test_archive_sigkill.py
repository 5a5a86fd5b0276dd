"""The archive on the real broker, SIGKILLed twice while it writes: every record id once in the Parquet files.

Results (each published twice, as a producer's resend would), costs and feedback are on the log
before the archive starts, so it writes batch after batch; it is killed once its first manifests
are in place and again after its restart has written more. Offsets are committed every 3 s, so
each kill leaves batches that are archived but not committed: the restarted process meets them
again (it must skip them by their manifests' ranges), and the resends must be dropped by id.
Pass: the files (read raw, without the reader's dedupe) hold each published record id exactly
once, per kind, and nothing else; the restarted process logged at least once that it skipped
records archived before (the kill landed between a batch's commit point and its offset commit).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from llmbus.archive import read, rlhf
from llmbus.bus import Bus
from llmbus.bus.admin import ensure_catalog
from llmbus.contract import topics as t
from llmbus.contract.messages import CostRecord, Feedback, InferenceResult, Message, ResultStatus
from llmbus_tools.harness.service_procs import ServiceProc, drop_namespace, fresh_settings

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
RESULTS, COSTS, FEEDBACK = 4000, 1500, 800
TENANTS = ("acme", "globex", "initech")


def workload() -> dict[str, list[tuple[Message, str]]]:
    results = [
        InferenceResult(request_id=f"r{n}", tenant=TENANTS[n % 3], status=ResultStatus.OK, text="x" * 200)
        for n in range(RESULTS)
    ]
    costs = [
        CostRecord(request_id=f"r{n}", record_id=f"r{n}", tenant=TENANTS[n % 3], model="m", cost_usd=0.0)
        for n in range(COSTS)
    ]
    feedback = [Feedback(request_id=f"r{n}", tenant=TENANTS[n % 3], score=(n % 5) / 4) for n in range(FEEDBACK)]
    return {
        t.RESULTS: [(r, r.request_id) for r in results] * 2,  # every result twice: a resend
        t.COSTS: [(c, c.record_id) for c in costs],
        t.FEEDBACK: [(f, f.request_id) for f in feedback],
    }


def expected_ids() -> dict[str, set[str]]:
    return {
        "results": {f"{TENANTS[n % 3]}/r{n}" for n in range(RESULTS)},
        "costs": {f"{TENANTS[n % 3]}/r{n}" for n in range(COSTS)},
        "feedback_requests": {f"r{n}" for n in range(FEEDBACK)},
    }


async def publish(settings, records: dict[str, list[tuple[Message, str]]]) -> None:  # type: ignore[no-untyped-def]
    bus = await Bus.start(settings, t.CLIENT)
    try:
        for base, items in records.items():
            for start in range(0, len(items), 1000):
                chunk = [(message, None, key) for message, key in items[start : start + 1000]]
                await bus.publisher.publish_many(settings.topic_prefix + base, chunk)
    finally:
        await bus.stop()


def manifests(root: Path) -> int:
    return len(list((root / "_manifests").glob("*/*/*.json"))) if (root / "_manifests").exists() else 0


def archived_ids(root: Path) -> dict[str, Counter[str]]:
    return {
        kind: Counter(read.read_table(root, kind).column("record_id").to_pylist())
        for kind in ("results", "costs", "feedback")
    }


async def until(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


def complete(root: Path) -> bool:
    ids = archived_ids(root)
    want = expected_ids()
    return (
        len(ids["results"]) >= len(want["results"])
        and len(ids["costs"]) >= len(want["costs"])
        and len(ids["feedback"]) >= len(want["feedback_requests"])
    )


async def test_archive_survives_sigkill_mid_batch_with_every_record_once(tmp_path: Path) -> None:
    settings = fresh_settings()
    root = tmp_path / "archive"
    env = {
        "LLMBUS_ARCHIVE_DIR": str(root),
        "LLMBUS_ARCHIVE_BATCH_MAX_RECORDS": "200",
        "LLMBUS_ARCHIVE_PROMPTS": "false",
        "LLMBUS_ARCHIVE_ORPHAN_AGE_S": "0",
        "LLMBUS_COMMIT_INTERVAL_S": "3",
        "LLMBUS_SESSION_TIMEOUT_MS": "6000",
        "LLMBUS_HEARTBEAT_INTERVAL_MS": "500",
    }
    try:
        await ensure_catalog(settings)
        await publish(settings, workload())
        archive = ServiceProc("llmbus_services.archive", settings, env, log_dir=tmp_path, name="archive").start()
        try:
            await until(lambda: manifests(root) >= 4, 90, "the archive wrote no batch")
            archive.kill()
            first_kill = manifests(root)
            archive.start()
            await until(lambda: manifests(root) >= first_kill + 4, 90, "the restarted archive wrote no batch")
            archive.kill()
            archive.start()
            await until(lambda: complete(root), 120, "the archive did not catch up")
            await asyncio.sleep(4)  # past a commit interval: anything written twice would show now
            log = archive.log_path.read_text()
        finally:
            archive.terminate(30)
        ids = archived_ids(root)
        want = expected_ids()
        assert set(ids["results"]) == want["results"]
        assert set(ids["costs"]) == want["costs"]
        assert {i.split("/")[1] for i in ids["feedback"]} == want["feedback_requests"]
        assert len(ids["feedback"]) == FEEDBACK
        doubled = {kind: [i for i, n in counts.items() if n > 1] for kind, counts in ids.items()}
        assert not any(doubled.values()), f"record ids archived twice: {doubled}"
        assert "archived before, skipped" in log, "no kill landed between a batch's manifest and its commit"
        # The export reads what the service wrote: one record per result with feedback, each with its score.
        records = rlhf.join(*(read.read_rows(root, kind) for kind in ("results", "requests", "feedback", "costs")))
        assert sorted(r.request_id for r in records) == sorted(want["feedback_requests"])
        assert all(r.score == (int(r.request_id[1:]) % 5) / 4 and len(r.feedback) == 1 for r in records)
        print(
            f"manifests {manifests(root)}; skipped-after-restart lines {log.count('archived before, skipped')}; "
            f"unfinished removed: {[line for line in log.splitlines() if 'unfinished' in line]}"
        )
    finally:
        await drop_namespace(settings)
