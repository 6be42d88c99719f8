"""A source's own durable state in the store: a snapshot and the changes since, as numbered files.

``<store>/sources/<source>/<seq>.snapshot.json`` holds the whole state, ``<seq>.delta.json`` what changed
after the file before it; both in the store's format (``store.files``: versioned, checksummed, written once).
The state is the newest snapshot with every later delta applied in order (the source applies them: this
module does not know what they mean). A delta costs what changed, not the whole state; a new snapshot is
written when the deltas since the last one weigh as much as it (or number ``MAX_DELTAS``), so the log stays
within about twice the state's size and a restart reads at most ``MAX_DELTAS`` + 1 files. Files before the
newest snapshot are removed after it is written (a crash in between leaves them; they are ignored).

Only the driver writes here, under the store's driver fence; each number is created once (create-if-absent).
A gap in the numbers after the newest snapshot,
or a delta with no snapshot before it, is a damaged store: a clear ``RegionalStoreError``, never a guess.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from regional.errors import NEW_QUERY, RegionalStoreError
from regional.storage import Storage
from regional.store import files

KIND = "source-log"
MAX_DELTAS = 256
MIN_SNAPSHOT_BYTES = 1 << 20  # below this, deltas pile up to 1 MiB before a new snapshot
_NAME = re.compile(r"^([0-9]{12})\.(snapshot|delta)\.json$")


class SourceLog:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.directory = storage.describe()
        self.seq = -1  # the newest file's number; -1 before the first
        self.snapshot_bytes = 0
        self.delta_bytes = 0  # written since the newest snapshot
        self.deltas = 0

    def __repr__(self) -> str:
        return f"SourceLog({str(self.directory)!r})"

    def _listing(self) -> list[tuple[int, str]]:
        names = (info.name.rpartition("/")[2] for info in self.storage.list())
        return sorted((int(m.group(1)), m.group(2)) for n in names if (m := _NAME.match(n)))

    def exists(self) -> bool:
        return bool(self._listing())

    def load(self) -> tuple[Any, list[Any]] | None:
        """The newest snapshot and the deltas after it, oldest first; None when nothing was ever written."""
        listing = self._listing()
        if not listing:
            return None
        snapshots = [i for i, (_seq, kind) in enumerate(listing) if kind == "snapshot"]
        if not snapshots:
            raise RegionalStoreError(
                f"the regional store's source log {self.directory} holds changes but no snapshot to apply them "
                "to: it was damaged. Restore it from a backup, or " + NEW_QUERY)
        first = snapshots[-1]
        rest = listing[first:]
        for (a, _), (b, _) in itertools.pairwise(rest):
            if b != a + 1:
                raise RegionalStoreError(
                    f"the regional store's source log {self.directory} has no file {a + 1:012d} between {a:012d} "
                    f"and {b:012d}: it was damaged. Restore it from a backup, or start the query on a new "
                    "checkpointLocation")
        values, sizes = [], []
        for seq, kind in rest:
            name = _file_name(seq, kind)
            raw = self.storage.read(name)
            if raw is None:
                raise RegionalStoreError(f"the regional store's source log file {self.storage.describe(name)} "
                                         "vanished while it was read: is another process removing files of the "
                                         "regional store?")
            values.append(files.decode(self.storage.describe(name), KIND, raw))
            sizes.append(len(raw))
        self.seq = rest[-1][0]
        self.snapshot_bytes, self.delta_bytes, self.deltas = sizes[0], sum(sizes[1:]), len(sizes) - 1
        return values[0], values[1:]

    def wants_snapshot(self) -> bool:
        """The deltas since the newest snapshot weigh as much as a new one would (about), or are many."""
        return self.seq < 0 or self.deltas >= MAX_DELTAS or self.delta_bytes >= max(self.snapshot_bytes,
                                                                                      MIN_SNAPSHOT_BYTES)

    def write_snapshot(self, state: Any) -> None:
        """The whole state, as the newest file; the older files are removed after it is written."""
        data = files.encode(KIND, state)
        self._create(self.seq + 1, "snapshot", data)
        self.snapshot_bytes, self.delta_bytes, self.deltas = len(data), 0, 0
        for seq, kind in self._listing():
            if seq < self.seq:
                self.storage.delete(_file_name(seq, kind))

    def append(self, delta: Any) -> None:
        """What changed since the newest file."""
        if self.seq < 0:
            raise RegionalStoreError(f"{self}: a delta needs a snapshot before it (write_snapshot first)")
        data = files.encode(KIND, delta)
        self._create(self.seq + 1, "delta", data)
        self.delta_bytes += len(data)
        self.deltas += 1

    def _create(self, seq: int, kind: str, data: bytes) -> None:
        """File ``seq`` is written once: a second writer of the same number (another driver) is refused."""
        name = _file_name(seq, kind)
        if not self.storage.create(name, data):
            raise RegionalStoreError(
                f"the regional store's source log file {self.storage.describe(name)} was written by another "
                "process first: two drivers are running the query. This one stops; start it again once the "
                "other has stopped")
        self.seq = seq

    def total_bytes(self) -> int:
        return self.snapshot_bytes + self.delta_bytes


def _file_name(seq: int, kind: str) -> str:
    return f"{seq:012d}.{kind}.json"
