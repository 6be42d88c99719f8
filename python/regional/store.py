"""The regional store of one query: ``<checkpointLocation>/regional/``.

Layout (every file written atomically: a hidden temporary file, fsync, rename):

    epochs/<epoch>.json    one record per decided epoch, holding every region's
                           state after it; the newest record is the current state
    intents/<epoch>.json   the write-ahead intent of phase two: the decision and the
                           handles about to be published, written before publishing
    cuts/<epoch>/<partition>-<attempt>.json
                           where the source stopped reading a region at its regionTimeout
    receiving/<epoch>/<partition>-<attempt>
                           a sink task has received rows: the source's regionTimeout clock starts
    final-epoch-request.json
                           a graceful stop asks for a final global epoch
    sink-options.json      regional settings given on writeStream, for the source's tasks
    referenced-epochs      the live ref_epochs, one per line: the JVM shim keeps Spark's
                           offsets/N and commits/N of these through Spark's log purge
    query-plan.json        written by the JVM shim at query start: whether the plan
                           between source and sink allows regional epochs
    failures/<epoch>/<partition>-<attempt>.json
                           written by the JVM shim: why a task attempt failed

Region ids live only inside the JSON, never in a path. Files whose names start
with ``.`` are torn temporaries from a crash and are ignored.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regional.decision import Decision, EpochKind, RegionRecord, RegionState
from regional.errors import RegionalConfigError, RegionalStoreError

STORE_DIR = "regional"
FORMAT_VERSION = 1


def local_path(location: str) -> Path:
    """A checkpoint location as a local path (``file:`` URIs accepted)."""
    if location.startswith("file://"):
        location = location[len("file://"):]
    elif location.startswith("file:"):
        location = location[len("file:"):]
    elif "://" in location:
        raise RegionalConfigError(
            f"checkpointLocation {location!r} is not on the local file system; "
            "regional stores its metadata with local file operations: use a local or mounted path"
        )
    return Path(os.path.abspath(location))


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


@dataclass(frozen=True)
class FallBack:
    ref_epoch: int
    reason: str
    quarantined: bool = False


@dataclass(frozen=True)
class Slice:
    """What one region published in one epoch."""

    start: int
    end: int
    rows: int


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    kind: EpochKind
    committed: dict[str, Slice]
    fallen_back: dict[str, FallBack]
    regions: dict[str, RegionRecord]  # every known region's state after this epoch
    reason: str | None = None
    regional_epochs: int = 0  # regional epochs so far in this query, this one included

    @classmethod
    def from_decision(cls, epoch: int, decision: Decision, previous: EpochRecord | None) -> EpochRecord:
        fallen = {}
        for region, why in decision.fallen_back.items():
            ref = decision.regions[region].ref_epoch
            fallen[region] = FallBack(-1 if ref is None else ref, why, region in decision.quarantined)
        committed = {r: Slice(*v) for r, v in decision.committed.items()}
        regional = (previous.regional_epochs if previous else 0) + (decision.kind is EpochKind.REGIONAL)
        return cls(epoch, decision.kind, committed, fallen, decision.regions, decision.reason, regional)

    @property
    def whole(self) -> bool:
        """No region is behind: every known region is current."""
        return all(s.state is RegionState.OK for s in self.regions.values())

    @property
    def oldest_ref_epoch(self) -> int | None:
        """The oldest epoch a fallen-back region still references (FLIP-600's second metric).
        A region's ref_epoch is set exactly when it fell back in this epoch, so this covers them all."""
        refs = [f.ref_epoch for f in self.fallen_back.values()]
        return min(refs) if refs else None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "epoch": self.epoch,
            "kind": self.kind.value,
            "reason": self.reason,
            "regional_epochs": self.regional_epochs,
            "committed": {r: vars(s) for r, s in self.committed.items()},
            "fallen_back": {r: vars(f) for r, f in self.fallen_back.items()},
            "regions": {
                r: {"committed_offset": s.committed_offset, "current_epoch": s.current_epoch,
                    "consecutive_failures": s.consecutive_failures, "state": s.state.value, "reason": s.reason}
                for r, s in self.regions.items()
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EpochRecord:
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"unknown record format version {data.get('version')!r}")
        return cls(
            epoch=int(data["epoch"]),
            kind=EpochKind(data["kind"]),
            committed={r: Slice(int(s["start"]), int(s["end"]), int(s["rows"])) for r, s in data["committed"].items()},
            fallen_back={r: FallBack(int(f["ref_epoch"]), str(f["reason"]), bool(f.get("quarantined", False)))
                         for r, f in data["fallen_back"].items()},
            regions={
                r: RegionRecord(int(s["committed_offset"]),
                                None if s["current_epoch"] is None else int(s["current_epoch"]),
                                int(s["consecutive_failures"]), RegionState(s["state"]), s.get("reason"))
                for r, s in data["regions"].items()
            },
            reason=data.get("reason"),
            regional_epochs=int(data.get("regional_epochs", 0)),
        )


@dataclass(frozen=True)
class Intent:
    """Phase two of an epoch as decided, before anything is published.

    A re-run of the epoch after a crash finishes exactly this, whatever its own
    tasks reported: ``publish`` goes out (idempotently), ``discard`` is aborted.
    """

    record: EpochRecord
    publish: dict[str, Any]  # region -> handle
    discard: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"record": self.record.to_json(), "handles": _pickle_b64({"publish": self.publish,
                                                                       "discard": self.discard})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Intent:
        handles = pickle.loads(base64.b64decode(data["handles"]))
        return cls(EpochRecord.from_json(data["record"]), handles["publish"], handles["discard"])


def _pickle_b64(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


class Store:
    """Reads and writes one query's regional store. Safe to build anywhere (driver, worker, CLI)."""

    def __init__(self, checkpoint_location: str | os.PathLike[str]) -> None:
        self.checkpoint = local_path(os.fspath(checkpoint_location))
        self.root = self.checkpoint / STORE_DIR
        self._epochs = self.root / "epochs"
        self._intents = self.root / "intents"
        self._cuts = self.root / "cuts"
        self._receiving = self.root / "receiving"
        self._sink_options = self.root / "sink-options.json"
        self._final_request = self.root / "final-epoch-request.json"
        self._referenced = self.root / "referenced-epochs"
        self._query_plan = self.root / "query-plan.json"
        self._failures = self.root / "failures"

    def __repr__(self) -> str:
        return f"Store({str(self.checkpoint)!r})"

    # -- epoch records -----------------------------------------------------

    def epochs(self) -> list[int]:
        """Epoch numbers that have a record, ascending."""
        return _numbered_files(self._epochs)

    def read_record(self, epoch: int) -> EpochRecord | None:
        data = self._read_json(self._epochs / _name(epoch))
        if data is None:
            return None
        try:
            return EpochRecord.from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise self._corrupt(self._epochs / _name(epoch), exc) from None

    def latest_record(self, before: int | None = None) -> EpochRecord | None:
        """The newest record (below epoch ``before``, if given)."""
        for epoch in reversed(self.epochs()):
            if before is None or epoch < before:
                return self.read_record(epoch)
        return None

    def region_states(self, before: int | None = None) -> dict[str, RegionRecord]:
        record = self.latest_record(before)
        return dict(record.regions) if record else {}

    def records(self) -> list[EpochRecord]:
        return [r for e in self.epochs() if (r := self.read_record(e)) is not None]

    def write_record(self, record: EpochRecord) -> None:
        # The references first: once the record exists, Spark's purge must already see them.
        referenced = sorted({s.ref_epoch for s in record.regions.values() if s.ref_epoch is not None} - {-1})
        _atomic_write(self._referenced, "".join(f"{e}\n" for e in referenced))
        _atomic_write_json(self._epochs / _name(record.epoch), record.to_json())

    def referenced_epochs(self) -> list[int]:
        """The epochs whose Spark offset-log entries the JVM shim keeps (see ``write_record``)."""
        try:
            return [int(line) for line in self._referenced.read_text(encoding="utf-8").split()]
        except FileNotFoundError:
            return []

    # -- intents -----------------------------------------------------------

    def read_intent(self, epoch: int) -> Intent | None:
        path = self._intents / _name(epoch)
        data = self._read_json(path)
        if data is None:
            return None
        try:
            return Intent.from_json(data)
        except (KeyError, TypeError, ValueError, pickle.UnpicklingError, EOFError) as exc:
            raise self._corrupt(path, exc) from None

    def write_intent(self, epoch: int, intent: Intent) -> None:
        _atomic_write_json(self._intents / _name(epoch), intent.to_json())

    # -- settings the sink shares with the source --------------------------------

    def write_sink_options(self, options: Mapping[str, str]) -> None:
        _atomic_write_json(self._sink_options, dict(options))

    def read_sink_options(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in (self._read_json(self._sink_options) or {}).items()}

    # -- written by the JVM shim ------------------------------------------------

    def read_query_plan(self) -> QueryPlanCheck | None:
        """The shim's plan check of the current run; None without the shim."""
        data = self._read_json(self._query_plan)
        if data is None:
            return None
        return QueryPlanCheck(bool(data.get("regional_epochs", True)), data.get("operator"), data.get("reason"))

    def plan_allows_regional_epochs(self) -> bool:
        """False when the shim found an operator that mixes regions between tasks (all-or-nothing epochs)."""
        check = self.read_query_plan()
        return check is None or check.regional_epochs

    def read_failures(self, epoch: int) -> dict[int, list[TaskFailure]]:
        """Failed task attempts of ``epoch`` by partition, oldest attempt first."""
        failures: dict[int, list[TaskFailure]] = {}
        directory = self._failures / str(epoch)
        for path in sorted(directory.glob("[0-9]*-[0-9]*.json")) if directory.is_dir() else ():
            data = self._read_json(path)
            if data is None:
                continue
            try:
                failure = TaskFailure(int(data["partition"]), int(data["attempt"]), str(data.get("executor", "")),
                                      str(data.get("exception_class", "")), str(data.get("message", "")))
            except (KeyError, TypeError, ValueError) as exc:
                raise self._corrupt(path, exc) from None
            failures.setdefault(failure.partition, []).append(failure)
        return {p: sorted(fs, key=lambda f: f.attempt) for p, fs in failures.items()}

    # -- regionTimeout cuts ---------------------------------------------------

    def write_cut(self, epoch: int, partition: int, attempt: int, region: str, end: int) -> None:
        """The source stopped reading ``region`` at ``end`` in this task attempt."""
        _atomic_write_json(self._cuts / str(epoch) / f"{partition}-{attempt}.json", {"region": region, "end": end})

    def read_cut(self, epoch: int, partition: int, attempt: int) -> tuple[str, int] | None:
        path = self._cuts / str(epoch) / f"{partition}-{attempt}.json"
        data = self._read_json(path)
        if data is None:
            return None
        try:
            return str(data["region"]), int(data["end"])
        except (KeyError, TypeError, ValueError) as exc:
            raise self._corrupt(path, exc) from None

    def sink_receiving_path(self, epoch: int, partition: int, attempt: int) -> Path:
        """The marker a sink task leaves on its first rows, starting its source's regionTimeout clock."""
        return self._receiving / str(epoch) / f"{partition}-{attempt}"

    # -- graceful stop -----------------------------------------------------

    def request_final_epoch(self, after_epoch: int) -> None:
        _atomic_write_json(self._final_request, {"after_epoch": after_epoch, "requested_at": time.time()})

    def final_epoch_requested_since(self, since: float) -> bool:
        """A graceful stop asked for a final global epoch at or after ``since`` (a stale request
        left by a driver that died while stopping is ignored by the next run)."""
        data = self._read_json(self._final_request)
        return data is not None and float(data.get("requested_at", 0)) >= since

    def clear_final_epoch_request(self) -> None:
        _unlink(self._final_request)

    # -- retention ---------------------------------------------------------

    def prune(self, retain_epochs: int) -> None:
        """Drop records beyond the newest ``retain_epochs`` unless a live ``ref_epoch`` needs them,
        and intents of recorded epochs."""
        epochs = self.epochs()
        if not epochs:
            return
        latest = self.read_record(epochs[-1])
        assert latest is not None
        referenced = {s.ref_epoch for s in latest.regions.values() if s.ref_epoch is not None}
        for epoch in epochs[:-retain_epochs]:
            if epoch not in referenced:
                _unlink(self._epochs / _name(epoch))
        for epoch in _numbered_files(self._intents):
            if epoch <= epochs[-1]:
                _unlink(self._intents / _name(epoch))
        for per_epoch in (*self._cuts.glob("[0-9]*"), *self._receiving.glob("[0-9]*"),
                          *self._failures.glob("[0-9]*")):
            if int(per_epoch.name) <= epochs[-1]:
                shutil.rmtree(per_epoch, ignore_errors=True)

    # -- helpers -----------------------------------------------------------

    def _read_json(self, path: Path) -> dict[str, Any] | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise self._corrupt(path, exc) from None
        if not isinstance(data, dict):
            raise self._corrupt(path, ValueError("not a JSON object"))
        return data

    def _corrupt(self, path: Path, exc: Exception) -> RegionalStoreError:
        return RegionalStoreError(
            f"the regional store record {path} is corrupt ({type(exc).__name__}: {exc}). "
            "It was not written by regional, or was damaged. Restore it from a backup; "
            "otherwise start the query on a new checkpointLocation (its input will be read again)"
        )


def _name(epoch: int) -> str:
    return f"{epoch:012d}.json"


def _numbered_files(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    numbers = []
    for name in names:
        stem, _dot, ext = name.partition(".")
        if not name.startswith(".") and ext == "json" and stem.isdigit():
            numbers.append(int(stem))
    return sorted(numbers)


def _atomic_write_json(path: Path, data: Mapping[str, Any]) -> None:
    _atomic_write(path, json.dumps(data, separators=(",", ":")))


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
