"""The record ids already archived in each day/tenant directory, read once per directory and kept for the
most recently written ones (the dedupe by record id of every archive target)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import PurePath


class RecordIds:
    def __init__(self, read: Callable[[PurePath], set[str]], max_dirs: int) -> None:
        self._read, self._max_dirs = read, max_dirs
        self._ids: OrderedDict[PurePath, set[str]] = OrderedDict()
        self._lock = threading.Lock()  # each subscription writes from its own thread

    def of(self, directory: PurePath) -> set[str]:
        """The ids in `directory` (read from the target the first time; least recently used forgotten)."""
        with self._lock:
            ids = self._ids.get(directory)
            if ids is None:
                ids = self._ids[directory] = self._read(directory)
                while len(self._ids) > self._max_dirs:
                    self._ids.popitem(last=False)
            self._ids.move_to_end(directory)
            return ids

    def learn(self, written: dict[PurePath, set[str]]) -> None:
        """A batch's ids, once its manifest is in place (a failed batch leaves nothing that hides its rows)."""
        with self._lock:
            for directory, ids in written.items():
                if directory in self._ids:
                    self._ids[directory] |= ids
