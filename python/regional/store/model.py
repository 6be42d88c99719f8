"""What the store holds, as plain typed data with JSON codecs (no I/O here).

One region-state type (``RegionState``) serves planning, the decision, the
epoch records and ``status``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple


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


class RegionState(NamedTuple):
    """A region's state after an epoch: where its next range starts, whether it is behind and why, and its dead
    letters (``regional.status(checkpoint).regions[region]``); what planning starts from."""

    # A NamedTuple, like Slice: immutable, and several times cheaper to build than a frozen dataclass (each epoch
    # builds one per region twice: at 10,000 regions, frozen dataclasses cost ~40 ms of the driver's epoch).

    committed_offset: int = 0  # the next offset to read
    last_epoch: int | None = None  # the last epoch that moved committed_offset; None if none has
    consecutive_failures: int = 0  # epochs in a row in which it fell back
    state: Standing = Standing.OK  # ok, fallen back or quarantined
    reason: str | None = None  # why it last fell back
    # deadLetterPath: offsets [lo, hi) hold a record that failed upstream on every attempt; the next
    # epochs plan the region in halves of it until that record stands alone (docs/design.md, "Dead letters").
    isolating: tuple[int, int] | None = None
    dead_letters: int = 0  # records of this region sent to the dead-letter table so far
    # regionTimeout: the most offsets its next range may hold, sized from how long its last slices took
    # (``protocol.decide.timed_range``); None: no limit of its own.
    timed_range: int | None = None
    # deadLetterRetries: epochs in which the record it isolates (at ``committed_offset``) failed alone on every
    # attempt while records beside it passed, without being dead-lettered yet (it had retries left), and when the
    # last of them was decided; the region is planned again ``deadLetterRetryBackoff`` after that. Both reset when
    # the region moves on (the record passed, or was dead-lettered).
    failed_alone: int = 0
    failed_alone_at: float | None = None  # when its record last failed alone (a try or not)
    # The evidence about the record it isolates (docs/design.md, "Poison or outage"), in epochs, the driver's clock:
    # ``alone_since``, the earliest epoch since its last try (or that try's) in which the record failed alone on
    # every attempt; ``probe_passed``, the latest epoch in which records beside it, of its own region, wrote rows. A
    # failure alone in an epoch after a ``probe_passed`` that is after ``alone_since`` is a try. ``alone_waits``:
    # its failures alone in a row that were no try (the back-off's exponent, and what status says).
    alone_since: int | None = None
    probe_passed: int | None = None
    alone_waits: int = 0
    # Its records dead-lettered lately, at most PROBE_SPAN offsets below committed_offset: probes skip them (a
    # poison record stays poison, it is no neighbour to try).
    poison: tuple[int, ...] = ()
    # When it was first seen (epoch, wall-clock seconds), kept until it first commits: the age of its ref_epoch -1.
    first_seen_epoch: int | None = None
    first_seen_at: float | None = None
    # When its suspect first failed alone (wall-clock seconds): ``suspectTimeout`` runs from here. Kept into the
    # records that failed beside a record dead-lettered by that policy (a burst with no witness is one wait, not one
    # per record), reset when it commits a record, a record is proven poison, or none failed beside it.
    suspect_since_at: float | None = None
    # ``suspectsTogether``: the end of the set weighed with its suspect, ``[committed_offset, together_to)``: the
    # records tried alone beside it, in every epoch it was, that failed alone each time (from its first failure
    # alone on; it only shrinks). Dead-lettered with the suspect on its proof. None: the suspect alone.
    together_to: int | None = None

    def retry_due(self, backoff_s: float, now: float | None = None) -> float | None:
        """When this region, whose isolated record failed alone, may be planned again: ``deadLetterRetryBackoff``
        (``backoff_s``) after a try with retries left, else ``suspect_backoff`` after a failure that was no try (an
        outage looks the same). None when it waits for nothing. A failure time after ``now`` (a clock that was
        ahead) counts as ``now``, so a restart with a shorter backoff still shortens the wait."""
        suspect = self.isolating
        if self.failed_alone_at is None or suspect is None or suspect[1] != self.committed_offset + 1:
            return None
        if not self.alone_waits and not self.failed_alone:
            return None
        wait = suspect_backoff(self.alone_waits) if self.alone_waits else backoff_s
        return (self.failed_alone_at if now is None else min(self.failed_alone_at, now)) + wait

    @property
    def ref_epoch(self) -> int | None:
        """The epoch whose offset a fallen-back region still uses (FLIP-600's ref_checkpoint_id);
        None when current; -1 when no epoch has committed it yet (it still uses its initial offset)."""
        if self.state is Standing.OK:
            return None
        return -1 if self.last_epoch is None else self.last_epoch

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RegionState:
        """One region's state as records of format v1 held it (an object per region)."""
        last = data["last_epoch"]
        reason = data["reason"]
        isolating = data.get("isolating")  # absent in records written before dead letters existed
        return cls(int(data["committed_offset"]), None if last is None else int(last),
                   int(data["consecutive_failures"]), _standing(data["state"]),
                   None if reason is None else str(reason),
                   None if isolating is None else (int(isolating[0]), int(isolating[1])),
                   int(data.get("dead_letters", 0)))


SUSPECT_BACKOFF_MAX_S = 10.0  # a suspect that looks like an outage is tried again at least this often


def suspect_backoff(waits: int) -> float:
    """How long a region waits after its isolated record failed alone ``waits`` times in a row without being a try
    (no evidence yet, or an outage): 1 s, doubling, at most ``SUSPECT_BACKOFF_MAX_S`` (so that it is current again
    within that long after an outage ends)."""
    return 0.0 if waits <= 0 else min(SUSPECT_BACKOFF_MAX_S, 2.0 ** min(waits - 1, 62))  # no float overflow


def _standing(value: Any) -> Standing:
    try:
        return _STANDINGS[value]  # a dict lookup: Standing(...) costs more, 10,000 times a record
    except (KeyError, TypeError):
        return Standing(value)  # raises the enum's own error


# Every region's state, one JSON list per field (format v2 of epoch records). A list of ints or nulls encodes
# and parses several times faster than an object per region: at 10,000 regions the record is read twice and
# written twice per epoch (planning, deciding, the intent, the record), and that was most of the driver's work.
REGION_STATE_COLUMNS = ("id", "committed_offset", "last_epoch", "consecutive_failures", "state", "reason", "isolating",
                  "dead_letters", "timed_range")
# Columns added later, absent from records written before them (each written only when some region has a value
# other than its default), with their defaults.
OPTIONAL_REGION_STATE_COLUMNS: dict[str, Any] = {
    "failed_alone": 0, "failed_alone_at": None, "alone_since": None, "probe_passed": None, "alone_waits": 0,
    "poison": (), "first_seen_epoch": None, "first_seen_at": None, "suspect_since_at": None, "together_to": None}
_OPTIONAL_DECODE: dict[str, Callable[[Any], Any]] = {
    "failed_alone": int, "failed_alone_at": float, "alone_since": int, "probe_passed": int, "alone_waits": int,
    "poison": lambda v: tuple(int(o) for o in v), "first_seen_epoch": int, "first_seen_at": float,
    "suspect_since_at": float, "together_to": int}


def regions_to_columns(regions: Mapping[str, RegionState]) -> dict[str, list[Any]]:
    states = list(regions.values())
    return {
        "id": list(regions),
        "committed_offset": [s.committed_offset for s in states],
        "last_epoch": [s.last_epoch for s in states],
        "consecutive_failures": [s.consecutive_failures for s in states],
        "state": [s.state.value for s in states],
        "reason": [s.reason for s in states],
        "isolating": [None if s.isolating is None else list(s.isolating) for s in states],
        "dead_letters": [s.dead_letters for s in states],
        "timed_range": [s.timed_range for s in states],
        **_optional_columns(states),
    }


def _optional_columns(states: list[RegionState]) -> dict[str, list[Any]]:
    """The optional columns some region has a value in (none in a healthy query: no cost per epoch there)."""
    columns = {}
    for name, default in OPTIONAL_REGION_STATE_COLUMNS.items():
        values = [getattr(s, name) for s in states]
        if any(v != default for v in values):
            columns[name] = [list(v) if isinstance(v, tuple) else v for v in values]
    return columns


def regions_from_columns(data: Mapping[str, Any]) -> dict[str, RegionState]:
    """The inverse of ``regions_to_columns``; a column of another length is an error, never a default."""
    columns = _columns(data, REGION_STATE_COLUMNS)
    regions = {
        str(r): RegionState(int(offset), None if last is None else int(last), int(failures), _standing(standing),
                            None if reason is None else str(reason),
                            None if isolating is None else (int(isolating[0]), int(isolating[1])), int(letters),
                            None if timed is None else int(timed))
        for r, offset, last, failures, standing, reason, isolating, letters, timed in zip(*columns, strict=True)
    }
    present = tuple(name for name in OPTIONAL_REGION_STATE_COLUMNS if name in data)
    if not present:
        return regions  # a record written before them, or in which no region has a value
    extra = _columns({"id": columns[0], **data}, ("id", *present))
    for r, *values in zip(*extra, strict=True):
        changes: dict[str, Any] = {name: None if v is None else _OPTIONAL_DECODE[name](v)
                                   for name, v in zip(present, values, strict=True)}
        changes = {k: v for k, v in changes.items() if v != OPTIONAL_REGION_STATE_COLUMNS[k]}
        if changes:
            regions[str(r)] = regions[str(r)]._replace(**changes)
    return regions


def _columns(data: Mapping[str, Any], names: tuple[str, ...]) -> list[list[Any]]:
    columns = [data[name] for name in names]
    if not all(isinstance(c, list) and len(c) == len(columns[0]) for c in columns):
        raise ValueError(f"columns {names} of different lengths or types")
    return columns


class Slice(NamedTuple):
    """What one region published in one epoch: offsets ``[start, end)``, ``rows`` rows written."""

    start: int
    end: int
    rows: int
    cut: bool = False  # a prefix of the planned range: the region hit regionTimeout


SLICE_COLUMNS = ("id", "start", "end", "rows", "cut")


def slices_to_columns(slices: Mapping[str, Slice]) -> dict[str, list[Any]]:
    values = list(slices.values())
    return {"id": list(slices), "start": [s.start for s in values], "end": [s.end for s in values],
            "rows": [s.rows for s in values], "cut": [s.cut for s in values]}


def slices_from_columns(data: Mapping[str, Any]) -> dict[str, Slice]:
    return {str(r): Slice(int(start), int(end), int(rows), bool(cut))
            for r, start, end, rows, cut in zip(*_columns(data, SLICE_COLUMNS), strict=True)}


@dataclass(frozen=True)
class FallBack:
    ref_epoch: int
    reason: str
    quarantined: bool = False


@dataclass(frozen=True)
class DeadLetter:
    """A record isolated as poison in one epoch and appended to the dead-letter table."""

    offset: int
    error: str  # the exception's class and message, as the failed attempts raised it (the first record's)
    count: int = 1  # records [offset, offset + count), proven poison together (``suspectsTogether``)
    # What the records after the first add to their own errors: why the set went unproven (onSuspectTimeout).
    note: str | None = None

    def member_error(self, own: str) -> str:
        """The error of a record of the set after the first: its own exception, and the set's note."""
        return own if self.note is None else f"{own}; {self.note} (with offset {self.offset})"

    def to_json(self) -> list[Any]:
        extra = [self.count, self.note] if self.note is not None else [self.count] if self.count != 1 else []
        return [self.offset, self.error, *extra]

    @classmethod
    def from_json(cls, data: list[Any]) -> DeadLetter:
        note = data[3] if len(data) > 3 else None
        return cls(int(data[0]), str(data[1]), int(data[2]) if len(data) > 2 else 1,
                   None if note is None else str(note))


OUTAGE_BACKOFF_MAX_S = 10.0  # short: Spark's stop waits for a source that is waiting


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
    # Epochs in a row, this one included, in which every region with work failed and nothing progressed (an
    # outage, not poison): the next epoch waits ``backoff_s`` after this one.
    outage_epochs: int = 0
    # The plan's deadLetterRetries and deadLetterRetryBackoff (seconds), for status: a region waiting for a retry
    # is due ``failed_alone_at`` + the backoff, and has had ``failed_alone`` of ``retries + 1`` tries.
    dead_letter_retries: int = 0
    dead_letter_retry_backoff_s: float = 0.0
    # The plan's suspectTimeout and onSuspectTimeout, for status: a suspect is resolved by ``suspect_since_at`` + this.
    suspect_timeout_s: float | None = None
    dead_letter_on_timeout: bool = False

    @property
    def backoff_s(self) -> float:
        """How long the next epoch waits after this one: 0, or 1 s after a stalled outage epoch, doubling with each
        one in a row, at most ``OUTAGE_BACKOFF_MAX_S``."""
        return 0.0 if self.outage_epochs <= 0 else min(OUTAGE_BACKOFF_MAX_S, 2.0 ** min(self.outage_epochs - 1, 62))

    @property
    def whole(self) -> bool:
        """No region is behind: every known region is current, and none was cut by regionTimeout in this epoch
        (a cut region committed a prefix and has the rest of its range still to read)."""
        return (all(s.state is Standing.OK for s in self.regions.values())
                and not any(s.cut for s in self.committed.values()))

    @property
    def ref_epochs(self) -> set[int]:
        """The epochs that fallen-back regions still reference (-1: a region no epoch has committed yet)."""
        # RegionState.ref_epoch, inlined: this runs over every region twice per epoch (record, prune).
        ok = Standing.OK
        return {-1 if s.last_epoch is None else s.last_epoch for s in self.regions.values() if s.state is not ok}

    @property
    def oldest_ref_epoch(self) -> int | None:
        """The oldest epoch a region still references (FLIP-600's second metric)."""
        refs = self.ref_epochs
        return min(refs) if refs else None

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "kind": self.kind.value,
            "reason": self.reason,
            "regional_epochs": self.regional_epochs,
            "recorded_at": self.recorded_at,
            "format": 2,
            "committed": slices_to_columns(self.committed),
            "fallen_back": {r: [f.ref_epoch, f.reason, f.quarantined] for r, f in self.fallen_back.items()},
            "regions": regions_to_columns(self.regions),
            "lost": {r: list(span) for r, span in self.lost.items()},
            "dead_lettered": {r: d.to_json() for r, d in self.dead_lettered.items()},
            "outage_epochs": self.outage_epochs,
            **({"dead_letter_retries": self.dead_letter_retries,
                "dead_letter_retry_backoff_s": self.dead_letter_retry_backoff_s}
               if self.dead_letter_retries or self.dead_letter_retry_backoff_s else {}),
            **({"suspect_timeout_s": self.suspect_timeout_s, "dead_letter_on_timeout": self.dead_letter_on_timeout}
               if self.suspect_timeout_s is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EpochRecord:
        columns = data.get("format") == 2  # else format v1: an object per region, a list per slice
        return cls(
            epoch=int(data["epoch"]),
            kind=EpochKind(data["kind"]),
            committed=slices_from_columns(data["committed"]) if columns else {
                str(r): Slice(int(s[0]), int(s[1]), int(s[2]), bool(s[3])) for r, s in data["committed"].items()},
            fallen_back={str(r): FallBack(int(f[0]), str(f[1]), bool(f[2])) for r, f in data["fallen_back"].items()},
            regions=regions_from_columns(data["regions"]) if columns else {
                str(r): RegionState.from_json(s) for r, s in data["regions"].items()},
            reason=None if data["reason"] is None else str(data["reason"]),
            regional_epochs=int(data["regional_epochs"]),
            recorded_at=float(data["recorded_at"]),
            lost={str(r): (int(a), int(b)) for r, (a, b) in data.get("lost", {}).items()},
            dead_lettered={str(r): DeadLetter.from_json(d) for r, d in data.get("dead_lettered", {}).items()},
            outage_epochs=int(data.get("outage_epochs", 0)),
            dead_letter_retries=int(data.get("dead_letter_retries", 0)),
            dead_letter_retry_backoff_s=float(data.get("dead_letter_retry_backoff_s", 0.0)),
            suspect_timeout_s=None if data.get("suspect_timeout_s") is None else float(data["suspect_timeout_s"]),
            dead_letter_on_timeout=bool(data.get("dead_letter_on_timeout", False)),
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
    dead_letters: dict[str, Any] = field(default_factory=dict)  # region -> staged handle in the dead-letter sink
    # Where they go, as decided: a re-run publishes them there even if the options name another place now.
    dead_letter_path: str | None = None
    dead_letter_topic: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = {"record": self.record.to_json(), "publish": self.publish, "discard": self.discard,
                "dead_letters": self.dead_letters, "dead_letter_path": self.dead_letter_path}
        if self.dead_letter_topic is not None:  # absent otherwise, as in intents written before topics
            data["dead_letter_topic"] = self.dead_letter_topic
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Intent:
        path, topic = data.get("dead_letter_path"), data.get("dead_letter_topic")
        return cls(EpochRecord.from_json(data["record"]), dict(data["publish"]), dict(data["discard"]),
                   dict(data.get("dead_letters", {})), None if path is None else str(path),
                   None if topic is None else str(topic))


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
    # The failure's whole description (a Python worker's traceback), as the shim saw it; None when it was too long,
    # or written by a shim that did not record it. Only read to name the exception's class (``failure_class``).
    description: str | None = None

    @property
    def in_python(self) -> bool:
        """A Python worker's failure (a UDF, the regional source or sink): the JVM's ``PythonException`` around
        Python's traceback, whose own exception line names what was raised."""
        return self.exception_class.endswith("PythonException")


def describe(record: EpochRecord) -> str:
    """One line per epoch: kind, regions committed, regions fallen back with ref_epoch, regions behind that had no
    work in it (waiting for a retry, or with nothing to read). A global epoch says that every region *with work*
    committed (issue 58: "global; committed 1" read as if one region were all there is)."""
    fallen = ", ".join(f"{r}(ref_epoch={f.ref_epoch}{', quarantined' if f.quarantined else ''})"
                       for r, f in sorted(record.fallen_back.items()))
    committed = f"committed {len(record.committed)} [{', '.join(sorted(record.committed))}]"
    if record.kind is EpochKind.GLOBAL:
        line = (f"epoch {record.epoch}: global, every region with work committed; {committed}" if record.committed
                else f"epoch {record.epoch}: global, no region had work")
    else:
        line = (f"epoch {record.epoch}: {record.kind.value}; {committed}; fallen back {len(record.fallen_back)}"
                + (f" [{fallen}]" if fallen else ""))
    ok = Standing.OK
    waiting = sorted(r for r, st in record.regions.items()
                     if st.state is not ok and r not in record.fallen_back and r not in record.committed)
    if waiting:
        shown = ", ".join(waiting[:5]) + (", ..." if len(waiting) > 5 else "")
        line += f"; waiting {len(waiting)} [{shown}] (behind, not planned: a retry or back-off not due yet)"
    if record.dead_lettered:
        line += (f"; dead-lettered {sum(d.count for d in record.dead_lettered.values())} ["
                 + ", ".join(f"{r}@{d.offset}" + (f"..{d.offset + d.count - 1}" if d.count > 1 else "")
                             for r, d in sorted(record.dead_lettered.items())) + "]")
    if record.reason:
        line += f"; {record.reason}"
    if record.outage_epochs:
        line += (f"; outage: every region with work failed ({record.outage_epochs} epoch(s) in a row), the next "
                 f"epoch waits {record.backoff_s:.0f}s")
    return line
