"""What the archive writes to (a directory, a bucket): the handler reaches every target through this."""

from __future__ import annotations

from pathlib import PurePath
from typing import Protocol

from llmbus.archive.layout import OffsetRange
from llmbus_services.archive.core.plan import BatchPlan


class ArchiveTarget(Protocol):
    def recover(self, orphan_age_s: float) -> tuple[int, int]:
        """At start: finish what a crash stopped past its commit point, remove old uncommitted leftovers."""
        ...

    def archived_ranges(self, topic: str, partition: int) -> list[OffsetRange]:
        """The offset ranges of the topic-partition's manifests: archived already."""
        ...

    def known_ids(self, directory: PurePath) -> set[str]:
        """The record ids already in a day/tenant directory."""
        ...

    def write(self, plan: BatchPlan) -> None:
        """Write a planned batch whole (data, then its manifest: the commit point); blocking."""
        ...
