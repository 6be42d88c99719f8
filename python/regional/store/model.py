"""What the store holds, as plain typed data with JSON codecs (no I/O here).

One region-state type (``RegionState``) serves planning, the decision, the
epoch records and ``status``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class EpochKind(str, Enum):
    GLOBAL = "global"  # every region that had data committed its slice
    REGIONAL = "regional"  # some regions committed; the others fell back
    FORCED_GLOBAL = "forced_global"  # had to be global, and was
    ABORTED = "aborted"  # nothing published


class Standing(str, Enum):
    """Where a region stands after an epoch."""

    OK = "ok"
    FALLEN_BACK = "fallen_back"
    QUARANTINED = "quarantined"


_STANDINGS = {s.value: s for s in Standing}


@dataclass(frozen=True)
class RegionState:
    """A region's state after an epoch: what planning starts from and what ``status`` shows."""

    committed_offset: int = 0  # the next offset to read
    last_epoch: int | None = None  # the last epoch that moved committed_offset; None if none has
    consecutive_failures: int = 0
    state: Standing = Standing.OK
    reason: str | None = None  # why it last fell back
    # deadLetterPath: offsets [lo, hi) hold a record that failed upstream on every attempt; the next
    # epochs plan the region in halves of it until that record stands alone (DESIGN.md section 3).
    isolating: tuple[int, int] | None = None
    dead_letters: int = 0  # records of this region sent to the dead-letter table so far

    @property
    def ref_epoch(self) -> int | None:
        """The epoch whose offset a fallen-back region still uses (FLIP-600's ref_checkpoint_id);
        None when current; -1 when no epoch has committed it yet (it still uses its initial offset)."""
        if self.state is Standing.OK:
            return None
        return -1 if self.last_epoch is None else self.last_epoch

    def to_json(self) -> dict[str, Any]:
        return {"committed_offset": self.committed_offset, "last_epoch": self.last_epoch,
                "consecutive_failures": self.consecutive_failures, "state": self.state.value, "reason": self.reason,
                "isolating": None if self.isolating is None else list(self.isolating),
                "dead_letters": self.dead_letters}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RegionState:
        last = data["last_epoch"]
        reason = data["reason"]
        isolating = data.get("isolating")  # absent in records written before dead letters existed
        try:
            standing = _STANDINGS[data["state"]]  # a dict lookup: Standing(...) costs more, 10,000 times a record
        except (KeyError, TypeError):
            standing = Standing(data["state"])  # raises the enum's own error
        return cls(int(data["committed_offset"]), None if last is None else int(last),
                   int(data["consecutive_failures"]), standing, None if reason is None else str(reason),
                   None if isolating is None else (int(isolating[0]), int(isolating[1])),
                   int(data.get("dead_letters", 0)))


@dataclass(frozen=True)
class Slice:
    """What one region published in one epoch: offsets ``[start, end)``, ``rows`` rows written."""

    start: int
    end: int
    rows: int
    cut: bool = False  # a prefix of the planned range: the region hit regionTimeout


@dataclass(frozen=True)
class FallBack:
    ref_epoch: int
    reason: str
    quarantined: bool = False


@dataclass(frozen=True)
class DeadLetter:
    """A record isolated as poison in one epoch and appended to the dead-letter table."""

    offset: int
    error: str  # the exception's class and message, as the failed attempts raised it


@dataclass(frozen=True)
class EpochRecord:
    """One decided and published epoch. ``regions`` holds every known region's state after it."""

    epoch: int
    kind: EpochKind
    committed: dict[str, Slice]
    fallen_back: dict[str, FallBack]
    regions: dict[str, RegionState]
    reason: str | None = None
    regional_epochs: int = 0  # regional epochs so far in this query, this one included
    recorded_at: float = 0.0  # wall-clock seconds when the epoch was decided
    lost: dict[str, tuple[int, int]] = field(default_factory=dict)  # region -> offsets skipped [from, to): gone
    dead_lettered: dict[str, DeadLetter] = field(default_factory=dict)  # region -> its record dead-lettered

    @property
    def whole(self) -> bool:
        """No region is behind: every known region is current."""
        return all(s.state is Standing.OK for s in self.regions.values())

    @property
    def oldest_ref_epoch(self) -> int | None:
        """The oldest epoch a region still references (FLIP-600's second metric)."""
        refs = [s.ref_epoch for s in self.regions.values() if s.ref_epoch is not None]
        return min(refs) if refs else None

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "kind": self.kind.value,
            "reason": self.reason,
            "regional_epochs": self.regional_epochs,
            "recorded_at": self.recorded_at,
            "committed": {r: [s.start, s.end, s.rows, s.cut] for r, s in self.committed.items()},
            "fallen_back": {r: [f.ref_epoch, f.reason, f.quarantined] for r, f in self.fallen_back.items()},
            "regions": {r: s.to_json() for r, s in self.regions.items()},
            "lost": {r: list(span) for r, span in self.lost.items()},
            "dead_lettered": {r: [d.offset, d.error] for r, d in self.dead_lettered.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EpochRecord:
        return cls(
            epoch=int(data["epoch"]),
            kind=EpochKind(data["kind"]),
            committed={str(r): Slice(int(s[0]), int(s[1]), int(s[2]), bool(s[3]))
                       for r, s in data["committed"].items()},
            fallen_back={str(r): FallBack(int(f[0]), str(f[1]), bool(f[2])) for r, f in data["fallen_back"].items()},
            regions={str(r): RegionState.from_json(s) for r, s in data["regions"].items()},
            reason=None if data["reason"] is None else str(data["reason"]),
            regional_epochs=int(data["regional_epochs"]),
            recorded_at=float(data["recorded_at"]),
            lost={str(r): (int(a), int(b)) for r, (a, b) in data.get("lost", {}).items()},
            dead_lettered={str(r): DeadLetter(int(o), str(e)) for r, (o, e) in data.get("dead_lettered", {}).items()},
        )


@dataclass(frozen=True)
class Intent:
    """Phase two of an epoch as decided, written before anything is published.

    A re-run of the epoch after a crash finishes exactly this, whatever its own
    tasks reported: ``publish`` goes out (idempotently), ``discard`` is aborted.
    Handles are JSON values (targets must return JSON-serialisable handles).
    """

    record: EpochRecord
    publish: dict[str, Any]  # region -> handle
    discard: dict[str, Any] = field(default_factory=dict)
    dead_letters: dict[str, Any] = field(default_factory=dict)  # region -> staged handle in the dead-letter table
    dead_letter_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"record": self.record.to_json(), "publish": self.publish, "discard": self.discard,
                "dead_letters": self.dead_letters, "dead_letter_path": self.dead_letter_path}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Intent:
        path = data.get("dead_letter_path")
        return cls(EpochRecord.from_json(data["record"]), dict(data["publish"]), dict(data["discard"]),
                   dict(data.get("dead_letters", {})), None if path is None else str(path))


@dataclass(frozen=True)
class QueryPlanCheck:
    """The JVM shim's verdict on the operators between the regional source and sink."""

    regional_epochs: bool
    operator: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class TaskFailure:
    """A failed task attempt, as the JVM shim's SparkListener saw it."""

    partition: int
    attempt: int
    executor: str
    exception_class: str
    message: str
