"""The regional store of one query: ``<checkpointLocation>/regional/``. Only the driver touches it.

Layout (every file in the format of ``store.files``: versioned, checksummed, atomic):

    query.json             the query id, created with the store
    epochs/<epoch>.json    one record per decided epoch, holding every region's state after it
    intents/<epoch>.json   the write-ahead intent of phase two (decision and handles), written
                           before anything is published
    write-options.json     writeStream's regional settings, recorded by the listener at query start
    write-options.taken.json  the same, once the source's first plan of the run has taken them
    latest-offsets.json    each region's end offset as the source last saw it (status shows the lag),
                           and its log start for sources with retention (status shows the headroom)
    starting-offsets.json  where the regions present when the query started begin (startingOffsets),
                           resolved once, at the first plan
    final-epoch-request.json
                           a graceful stop asks for a final global epoch
    referenced-epochs      the live ref_epochs: the JVM shim keeps Spark's offsets/N and
                           commits/N of these through Spark's log purge
    query-plan.json        written by the JVM shim at query start: whether the plan
                           between source and sink allows regional epochs
    failures/<epoch>/<partition>-<attempt>.json
                           written by the JVM shim: why a task attempt failed
    sources/<source>/      a source's own durable state (the files source's manifest of files in arrival
                           order): a snapshot and the changes since (``store.source_log``)
    driver.lock            locked (flock) by the driver running the query, for as long as it runs it; holds
                           who that is, for the error the next driver gets

Region ids live only inside the JSON, never in a path. Files whose names start
with ``.`` are temporaries of an interrupted write and are ignored.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from regional.bulk import cyclic_gc_paused
from regional.errors import RegionalStoreError
from regional.location import local_path
from regional.store import files
from regional.store.model import EpochRecord, Intent, QueryPlanCheck, RegionState, TaskFailure
from regional.store.source_log import SourceLog

STORE_DIR = "regional"
T = TypeVar("T")
# How long a starting driver waits for the lock: the Python process of a query stopped a moment ago in the
# same session may still be ending. Short: Spark read its offset log before, so a driver that waited for
# another to end starts from a stale log (Spark then fails it with CONCURRENT_STREAM_LOG_UPDATE).
FENCE_WAIT_S = 2.0
SAME_DRIVER_WAIT_S = 60.0
_fences: dict[Path, int] = {}  # lock files this process holds, and their descriptors


class Store:
    """Reads and writes one query's regional store (on the driver, or from the CLI)."""

    def __init__(self, checkpoint_location: str | os.PathLike[str]) -> None:
        self.checkpoint = local_path("checkpointLocation", checkpoint_location)
        self.root = self.checkpoint / STORE_DIR
        self._query = self.root / "query.json"
        self._epochs = self.root / "epochs"
        self._intents = self.root / "intents"
        self._write_options = self.root / "write-options.json"
        self._taken_write_options = self.root / "write-options.taken.json"
        self._latest_offsets = self.root / "latest-offsets.json"
        self._starting_offsets = self.root / "starting-offsets.json"
        self._final_request = self.root / "final-epoch-request.json"
        self._referenced = self.root / "referenced-epochs"
        self._query_plan = self.root / "query-plan.json"
        self._failures = self.root / "failures"

    def __repr__(self) -> str:
        return f"Store({str(self.checkpoint)!r})"

    # -- the query id ----------------------------------------------------------

    def query_id(self) -> str | None:
        data = files.read(self._query, "query")
        if data is None:
            return None
        try:
            return str(uuid.UUID(str(data["query_id"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise files.corrupt(self._query, f"no valid query_id ({exc})") from None

    def open_query(self) -> str:
        """The query id, created with the store on first use. A store that has epochs but no
        query id was damaged: that is an error, not a new query."""
        existing = self.query_id()
        if existing is not None:
            return existing
        if self.epochs() or _numbered_files(self._intents):
            raise RegionalStoreError(
                f"the regional store at {self.root} has epoch records but no {self._query.name}: it was damaged. "
                "Restore the file from a backup, or start the query on a new checkpointLocation"
            )
        files.create_exclusive(self._query, "query", {"query_id": str(uuid.uuid4()), "created_at": time.time()})
        created = self.query_id()
        assert created is not None
        return created

    # -- one driver at a time -------------------------------------------------------

    def fence(self, wait_s: float = FENCE_WAIT_S) -> None:
        """Take the query's driver lock, or fail: two drivers on one checkpoint would both decide and publish
        the same epochs. The lock is released when this process ends, however it ends (SIGKILL included).

        The source's Python process takes it; its parent is the driver's JVM. A holder with the same parent is
        the same driver's previous run of the query, still ending (Spark refuses two active runs of one query in
        one session): that one is waited for, up to ``SAME_DRIVER_WAIT_S``."""
        path = self.root / "driver.lock"
        if path in _fences:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        started = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(os.pread(fd, 4096, 0))
                same_driver = holder.get("parent") == os.getppid() and holder.get("host") == socket.gethostname()
                if time.monotonic() < started + (SAME_DRIVER_WAIT_S if same_driver else wait_s):
                    time.sleep(0.1)
                    continue
                os.close(fd)
                raise RegionalStoreError(
                    f"another driver is running the query of {self.checkpoint} ({_describe_holder(holder)}); two "
                    "drivers on one checkpointLocation would publish the same epochs twice. Stop the other query "
                    "first, or give this one its own checkpointLocation"
                ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "parent": os.getppid(), "host": socket.gethostname(),
                                  "since": time.time()}).encode(), 0)
        _fences[path] = fd

    # -- epoch records -----------------------------------------------------------

    def epochs(self) -> list[int]:
        """Epoch numbers that have a record, ascending."""
        return _numbered_files(self._epochs)

    @cyclic_gc_paused
    def read_record(self, epoch: int) -> EpochRecord | None:
        return _read_epoch_file(self._epochs / _name(epoch), "epoch", epoch, EpochRecord.from_json,
                                lambda r: r.epoch)

    def latest_record(self, before: int | None = None) -> EpochRecord | None:
        """The newest record (below epoch ``before``, if given)."""
        for epoch in reversed(self.epochs()):
            if before is None or epoch < before:
                return self.read_record(epoch)
        return None

    def region_states(self, before: int | None = None) -> dict[str, RegionState]:
        record = self.latest_record(before)
        return dict(record.regions) if record else {}

    def records(self) -> list[EpochRecord]:
        return [r for e in self.epochs() if (r := self.read_record(e)) is not None]

    def write_record(self, record: EpochRecord) -> None:
        # The references first: once the record exists, Spark's purge must already see them.
        referenced = sorted(record.ref_epochs - {-1})
        files.write(self._referenced, "referenced-epochs", referenced)
        files.write(self._epochs / _name(record.epoch), "epoch", record.to_json())

    def referenced_epochs(self) -> list[int]:
        """The epochs whose Spark offset-log entries the JVM shim keeps (see ``write_record``)."""
        data = files.read(self._referenced, "referenced-epochs")
        return [int(e) for e in data] if data is not None else []

    # -- intents -------------------------------------------------------------------

    def read_intent(self, epoch: int) -> Intent | None:
        return _read_epoch_file(self._intents / _name(epoch), "intent", epoch, Intent.from_json,
                                lambda i: i.record.epoch)

    def write_intent(self, epoch: int, intent: Intent) -> None:
        files.write(self._intents / _name(epoch), "intent", intent.to_json())

    # -- writeStream's settings, recorded at query start ----------------------------

    def record_write_options(self, run_id: str, options: Mapping[str, str]) -> None:
        files.write(self._write_options, "write-options",
                    {"run_id": run_id, "options": dict(options), "recorded_at": time.time()})

    def take_write_options(self) -> dict[str, str] | None:
        """The settings recorded at this run's start, for the source's first plan: the record is moved aside
        (``write-options.taken.json``), so that a later run that records none finds none, rather than this
        run's. None if there is no record this run has not taken."""
        options = self._read_write_options(self._write_options)
        if options is not None:
            files.move(self._write_options, self._taken_write_options)
        return options

    def read_write_options(self) -> dict[str, str] | None:
        """writeStream's regional settings as recorded at the latest query start (taken by the source or not yet);
        None if never recorded."""
        fresh = self._read_write_options(self._write_options)
        return fresh if fresh is not None else self._read_write_options(self._taken_write_options)

    def _read_write_options(self, path: Path) -> dict[str, str] | None:
        data = files.read(path, "write-options")
        if data is None:
            return None
        try:
            return {str(k): str(v) for k, v in data["options"].items()}
        except (KeyError, TypeError, AttributeError) as exc:
            raise files.corrupt(path, f"{type(exc).__name__}: {exc}") from None

    # -- what the source last saw, for lag -------------------------------------------------

    def record_latest_offsets(self, epoch: int, offsets: Mapping[str, int],
                              log_starts: Mapping[str, int] | None = None) -> None:
        files.write(self._latest_offsets, "latest-offsets",
                    {"epoch": epoch, "seen_at": time.time(), "offsets": dict(offsets),
                     "log_starts": None if log_starts is None else dict(log_starts)})

    def read_latest_offsets(self) -> dict[str, int]:
        """Each region's end offset as the source last saw it when planning; empty before the first plan."""
        return self._read_seen("offsets") or {}

    def read_log_starts(self) -> dict[str, int] | None:
        """Each region's log start as the source last saw it; None for sources that never lose records."""
        return self._read_seen("log_starts")

    def _read_seen(self, key: str) -> dict[str, int] | None:
        data = files.read(self._latest_offsets, "latest-offsets")
        if data is None or data.get(key) is None:
            return None
        try:
            return {str(r): int(o) for r, o in data[key].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise files.corrupt(self._latest_offsets, f"{type(exc).__name__}: {exc}") from None

    # -- where a new query starts ---------------------------------------------------------------

    def starting_offsets(self, resolve: Callable[[], Mapping[str, int]]) -> dict[str, int]:
        """Where the regions present at the query's first plan start: ``resolve()`` once, then kept, so a
        restart before any epoch (or ``startingOffsets=latest`` with nothing new yet) does not move them."""
        data = files.read(self._starting_offsets, "starting-offsets")
        if data is None and self.epochs():
            raise RegionalStoreError(
                f"the regional store at {self.root} has epoch records but no {self._starting_offsets.name}: it was "
                "damaged. Restore the file from a backup, or start the query on a new checkpointLocation")
        if data is None:
            starts = {str(r): int(o) for r, o in resolve().items()}
            files.create_exclusive(self._starting_offsets, "starting-offsets", starts)
            data = files.read(self._starting_offsets, "starting-offsets")
            if data is None:
                raise RegionalStoreError(f"{self._starting_offsets} vanished right after it was written: is another "
                                         "process removing files of the regional store?")
        try:
            return {str(r): int(o) for r, o in data.items()}
        except (TypeError, ValueError, AttributeError) as exc:
            raise files.corrupt(self._starting_offsets, f"{type(exc).__name__}: {exc}") from None

    def created_at(self) -> float | None:
        data = files.read(self._query, "query")
        return None if data is None else float(data.get("created_at", 0.0))

    # -- written by the JVM shim ------------------------------------------------------

    def read_query_plan(self) -> QueryPlanCheck | None:
        """The shim's plan check of the current run; None without the shim."""
        data = files.read(self._query_plan, "query-plan")
        if data is None:
            return None
        try:
            return QueryPlanCheck(bool(data["regional_epochs"]), data.get("operator"), data.get("reason"))
        except (KeyError, TypeError) as exc:
            raise files.corrupt(self._query_plan, f"{type(exc).__name__}: {exc}") from None

    def plan_allows_regional_epochs(self) -> bool:
        """False when the shim found an operator that mixes regions between tasks (all-or-nothing epochs)."""
        check = self.read_query_plan()
        return check is None or check.regional_epochs

    def read_failures(self, epoch: int) -> dict[int, list[TaskFailure]]:
        """Failed task attempts of ``epoch`` by partition, oldest attempt first."""
        failures: dict[int, list[TaskFailure]] = {}
        directory = self._failures / str(epoch)
        for path in sorted(directory.glob("[0-9]*-[0-9]*.json")) if directory.is_dir() else ():
            data = files.read(path, "failure")
            if data is None:
                continue
            try:
                failure = TaskFailure(int(data["partition"]), int(data["attempt"]), str(data["executor"]),
                                      str(data["exception_class"]), str(data["message"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise files.corrupt(path, f"{type(exc).__name__}: {exc}") from None
            failures.setdefault(failure.partition, []).append(failure)
        return {p: sorted(fs, key=lambda f: f.attempt) for p, fs in failures.items()}

    # -- graceful stop -------------------------------------------------------------------

    # -- a source's own state --------------------------------------------------------------

    def source_log(self, source: str) -> SourceLog:
        """The durable state of source ``source`` (a plain name, e.g. ``files``): see ``store.source_log``."""
        if not source.isidentifier():
            raise ValueError(f"a source log's name must be a plain name, not {source!r}")
        return SourceLog(self.root / "sources" / source)

    def request_final_epoch(self, after_epoch: int) -> None:
        files.write(self._final_request, "final-epoch-request", {"after_epoch": after_epoch,
                                                                 "requested_at": time.time()})

    def final_epoch_requested_since(self, since: float) -> bool:
        """A graceful stop asked for a final global epoch at or after ``since`` (a stale request
        left by a driver that died while stopping is ignored by the next run)."""
        data = files.read(self._final_request, "final-epoch-request")
        return data is not None and float(data.get("requested_at", 0)) >= since

    def clear_final_epoch_request(self) -> None:
        self._final_request.unlink(missing_ok=True)

    # -- retention -------------------------------------------------------------------------

    def prune(self, retain_epochs: int, latest: EpochRecord | None = None) -> None:
        """Drop records beyond the newest ``retain_epochs`` unless a live ``ref_epoch`` needs them,
        intents of recorded epochs, and the shim's failure records of recorded epochs. ``latest``: the
        newest record, when the caller has just written it (not read again: 10,000 regions take 50-100 ms)."""
        epochs = self.epochs()
        if not epochs:
            return
        if latest is None or latest.epoch != epochs[-1]:
            latest = self.read_record(epochs[-1])
        assert latest is not None
        referenced = latest.ref_epochs
        for epoch in epochs[:-retain_epochs]:
            if epoch not in referenced:
                (self._epochs / _name(epoch)).unlink(missing_ok=True)
        for epoch in _numbered_files(self._intents):
            if epoch <= epochs[-1]:
                (self._intents / _name(epoch)).unlink(missing_ok=True)
        for per_epoch in self._failures.glob("[0-9]*"):
            if per_epoch.name.isdigit() and int(per_epoch.name) <= epochs[-1]:
                shutil.rmtree(per_epoch, ignore_errors=True)


def _read_epoch_file(path: Path, kind: str, epoch: int, parse: Callable[[Any], T],
                     epoch_of: Callable[[T], int]) -> T | None:
    """A per-epoch store file, parsed; it must be the one of ``epoch``."""
    data = files.read(path, kind)
    if data is None:
        return None
    try:
        value = parse(data)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise files.corrupt(path, f"{type(exc).__name__}: {exc}") from None
    if epoch_of(value) != epoch:
        raise files.corrupt(path, f"it holds the {kind} of epoch {epoch_of(value)}, not of epoch {epoch}")
    return value


def _holder(raw: bytes) -> dict[str, Any]:
    try:
        holder = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe_holder(holder: dict[str, Any]) -> str:
    try:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder["since"])))
        return f"process {int(holder['pid'])} on {holder['host']}, since {since}"
    except (ValueError, KeyError, TypeError):
        return "its process left no name"


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

