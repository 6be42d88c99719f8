"""The regional store of one query: ``<checkpointLocation>/regional/``. Only the driver touches it.

On local disk or an object store (``regional.storage``): no file is renamed, and files whose name carries
their meaning are written once. Layout (every file in the format of ``store.files``: versioned, checksummed,
written whole):

    query.json             the query id, created with the store (create-if-absent)
    epochs/<epoch>.json    one record per decided epoch, holding every region's state after it
    intents/<epoch>.json   the write-ahead intent of phase two (decision and handles), written once
                           (create-if-absent: of two drivers, one decides), before anything is published
    write-options.json     writeStream's regional settings, recorded by the listener at query start
    write-options.taken.json  a copy, once the source's first plan of the run has taken them
    latest-offsets.json    each region's end offset as the source last saw it (status shows the lag),
                           and its log start for sources with retention (status shows the headroom)
    starting-offsets.json  where the regions present when the query started begin (startingOffsets),
                           resolved once, at the first plan (create-if-absent)
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
    driver.lock            the fence of the driver running the query (locally an flock, on an object store
                           a lease it renews); holds who that is, for the error the next driver gets

Region ids live only inside the JSON, never in a path. Files whose names start
with ``.`` are temporaries of an interrupted write and are ignored.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from regional.bulk import cyclic_gc_paused
from regional.errors import NEW_QUERY, RegionalStoreError
from regional.location import parse_location
from regional.storage import Storage, open_storage
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
_QUERY = "query.json"
_EPOCHS = "epochs"
_INTENTS = "intents"
_WRITE_OPTIONS = "write-options.json"
_TAKEN_WRITE_OPTIONS = "write-options.taken.json"
_LATEST_OFFSETS = "latest-offsets.json"
_STARTING_OFFSETS = "starting-offsets.json"
_FINAL_REQUEST = "final-epoch-request.json"
_REFERENCED = "referenced-epochs"
_QUERY_PLAN = "query-plan.json"
_STATUS = "status.json"
_FAILURES = "failures"
_FENCE = "driver.lock"
_FAILURE_NAME = re.compile(r"^[0-9]+-[0-9]+\.json$")


class Store:
    """Reads and writes one query's regional store (on the driver, or from the CLI)."""

    def __init__(self, checkpoint_location: str | os.PathLike[str]) -> None:
        self.checkpoint = parse_location("checkpointLocation", checkpoint_location)
        self.location = self.checkpoint.child(STORE_DIR)
        self.storage: Storage = open_storage(self.location)
        self.fence_token: str | None = None  # set once this process holds the query's driver fence

    def __repr__(self) -> str:
        return f"Store({str(self.checkpoint)!r})"

    @property
    def root(self) -> Path:
        """The store's directory, for a checkpoint on the local file system (tests and tools look inside it)."""
        return self.location.local_path()

    # -- the query id ----------------------------------------------------------

    def query_id(self) -> str | None:
        data = self._read(_QUERY, "query")
        if data is None:
            return None
        try:
            return str(uuid.UUID(str(data["query_id"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise self._corrupt(_QUERY, f"no valid query_id ({exc})") from None

    def open_query(self) -> str:
        """The query id, created with the store on first use. A store that has epoch records but no
        query id was damaged: that is an error, not a new query."""
        existing = self.query_id()
        if existing is not None:
            return existing
        if self.epochs() or self._numbered(_INTENTS):
            raise RegionalStoreError(
                f"the regional store at {self.location} has epoch records but no {_QUERY}: it was damaged. "
                "Restore the file from a backup, or " + NEW_QUERY
            )
        files.create_exclusive(self.storage, _QUERY, "query", {"query_id": str(uuid.uuid4()),
                                                               "created_at": time.time()})
        created = self.query_id()
        assert created is not None
        return created

    # -- one driver at a time -------------------------------------------------------

    def fence(self, wait_s: float = FENCE_WAIT_S) -> None:
        """Take the query's driver fence, or fail: two drivers on one checkpoint would both plan and decide
        the same epochs (the write-once intent of each epoch still lets only one of them publish it). Locally
        the fence is an ``flock``, released when this process ends, however it ends (SIGKILL included); on an
        object store a lease, which a dead driver's successor takes over once it has gone unrenewed for
        ``storage.fence_expiry_s`` (``regional.storage.object_store``). Once held, each call checks that it
        still is (``FenceLost``).

        The source's Python process takes it; its parent is the driver's JVM. A holder with the same parent is
        the same driver's previous run of the query, still ending (Spark refuses two active runs of one query in
        one session): that one is waited for, up to ``SAME_DRIVER_WAIT_S``."""
        if self.fence_token is not None:
            self.storage.check_fence(_FENCE)
            return
        token = uuid.uuid4().hex
        me = {"pid": os.getpid(), "parent": os.getppid(), "host": socket.gethostname(), "since": time.time(),
              "token": token}
        started = time.monotonic()
        while True:
            holder = self.storage.try_fence(_FENCE, me)
            if holder is None:
                self.fence_token = token
                return
            same_driver = holder.get("parent") == os.getppid() and holder.get("host") == socket.gethostname()
            waited = SAME_DRIVER_WAIT_S if same_driver else wait_s + self.storage.fence_expiry_s
            if time.monotonic() >= started + waited:
                raise RegionalStoreError(
                    f"another driver is running the query of {self.checkpoint} ({_describe_holder(holder)}); two "
                    "drivers on one checkpointLocation would publish the same epochs twice. Stop the other query "
                    "first, or give this one its own checkpointLocation"
                )
            time.sleep(0.1 if self.storage.fence_expiry_s == 0 else 1.0)

    def release_fence(self) -> None:
        """At a clean end of the run: let the next driver start without waiting out a lease."""
        if self.fence_token is not None:
            self.storage.release_fence(_FENCE)
            self.fence_token = None

    # -- epoch records -----------------------------------------------------------

    def epochs(self) -> list[int]:
        """Epoch numbers that have a record, ascending."""
        return self._numbered(_EPOCHS)

    @cyclic_gc_paused
    def read_record(self, epoch: int) -> EpochRecord | None:
        return self._read_epoch_file(f"{_EPOCHS}/{_name(epoch)}", "epoch", epoch, EpochRecord.from_json,
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
        files.write(self.storage, _REFERENCED, "referenced-epochs", referenced)
        files.write(self.storage, f"{_EPOCHS}/{_name(record.epoch)}", "epoch", record.to_json())

    def referenced_epochs(self) -> list[int]:
        """The epochs whose Spark offset-log entries the JVM shim keeps (see ``write_record``)."""
        data = self._read(_REFERENCED, "referenced-epochs")
        return [int(e) for e in data] if data is not None else []

    # -- intents -------------------------------------------------------------------

    def read_intent(self, epoch: int) -> Intent | None:
        return self._read_epoch_file(f"{_INTENTS}/{_name(epoch)}", "intent", epoch, Intent.from_json,
                                     lambda i: i.record.epoch)

    def write_intent(self, epoch: int, intent: Intent) -> None:
        """Written once: of two drivers deciding one epoch, the second is refused here, before it publishes."""
        name = f"{_INTENTS}/{_name(epoch)}"
        if not files.create_exclusive(self.storage, name, "intent", intent.to_json()):
            raise RegionalStoreError(
                f"epoch {epoch} was decided by another driver while this one decided it ({self.storage.describe(name)}"
                " exists): two drivers are running the query. This one stops without publishing; the next start "
                "finishes the epoch as the other decided it")

    # -- writeStream's settings, recorded at query start ----------------------------

    def record_write_options(self, run_id: str, options: Mapping[str, str]) -> None:
        files.write(self.storage, _WRITE_OPTIONS, "write-options",
                    {"run_id": run_id, "options": dict(options), "recorded_at": time.time()})

    def take_write_options(self) -> dict[str, str] | None:
        """The settings recorded at this run's start, for the source's first plan; None if there is no record
        this run has not taken. Taking one writes a copy beside it (``write-options.taken.json``, no rename):
        a later run that records none finds the record taken already, rather than using an earlier run's."""
        fresh = self._read(_WRITE_OPTIONS, "write-options")
        if fresh is None:
            return None
        taken = self._read(_TAKEN_WRITE_OPTIONS, "write-options")
        run_id = self._field(_WRITE_OPTIONS, fresh, "run_id")
        if taken is not None and self._field(_TAKEN_WRITE_OPTIONS, taken, "run_id") == run_id:
            return None
        files.write(self.storage, _TAKEN_WRITE_OPTIONS, "write-options", fresh)
        return self._options(_WRITE_OPTIONS, fresh)

    def read_write_options(self) -> dict[str, str] | None:
        """writeStream's regional settings as recorded at the latest query start (taken by the source or not yet);
        None if never recorded."""
        for name in (_WRITE_OPTIONS, _TAKEN_WRITE_OPTIONS):  # a store of an older regional moved it aside
            data = self._read(name, "write-options")
            if data is not None:
                return self._options(name, data)
        return None

    def _options(self, name: str, data: Any) -> dict[str, str]:
        try:
            return {str(k): str(v) for k, v in data["options"].items()}
        except (KeyError, TypeError, AttributeError) as exc:
            raise self._corrupt(name, f"{type(exc).__name__}: {exc}") from None

    def _field(self, name: str, data: Any, key: str) -> str:
        try:
            return str(data[key])
        except (KeyError, TypeError) as exc:
            raise self._corrupt(name, f"{type(exc).__name__}: {exc}") from None

    # -- what the source last saw, for lag -------------------------------------------------

    def record_latest_offsets(self, epoch: int, offsets: Mapping[str, int],
                              log_starts: Mapping[str, int] | None = None) -> None:
        files.write(self.storage, _LATEST_OFFSETS, "latest-offsets",
                    {"epoch": epoch, "seen_at": time.time(), "offsets": dict(offsets),
                     "log_starts": None if log_starts is None else dict(log_starts)})

    def write_status(self, snapshot: dict[str, Any]) -> None:
        """The read model as of a recorded epoch (``regional.store.status.snapshot``), replaced whole: what the
        JVM shim's Spark UI tab and metrics show. A view only: nothing reads it to decide or publish."""
        files.write(self.storage, _STATUS, "status", snapshot)

    def read_status(self) -> dict[str, Any] | None:
        return files.read(self.storage, _STATUS, "status")

    def read_latest_offsets(self) -> dict[str, int]:
        """Each region's end offset as the source last saw it when planning; empty before the first plan."""
        return self._read_seen("offsets") or {}

    def read_log_starts(self) -> dict[str, int] | None:
        """Each region's log start as the source last saw it; None for sources that never lose records."""
        return self._read_seen("log_starts")

    def _read_seen(self, key: str) -> dict[str, int] | None:
        data = self._read(_LATEST_OFFSETS, "latest-offsets")
        if data is None or data.get(key) is None:
            return None
        try:
            return {str(r): int(o) for r, o in data[key].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise self._corrupt(_LATEST_OFFSETS, f"{type(exc).__name__}: {exc}") from None

    # -- where a new query starts ---------------------------------------------------------------

    def starting_offsets(self, resolve: Callable[[], Mapping[str, int]]) -> dict[str, int]:
        """Where the regions present at the query's first plan start: ``resolve()`` once, then kept, so a
        restart before any epoch (or ``startingOffsets=latest`` with nothing new yet) does not move them."""
        data = self._read(_STARTING_OFFSETS, "starting-offsets")
        if data is None and self.epochs():
            raise RegionalStoreError(
                f"the regional store at {self.location} has epoch records but no {_STARTING_OFFSETS}: it was "
                "damaged. Restore the file from a backup, or " + NEW_QUERY)
        if data is None:
            starts = {str(r): int(o) for r, o in resolve().items()}
            files.create_exclusive(self.storage, _STARTING_OFFSETS, "starting-offsets", starts)
            data = self._read(_STARTING_OFFSETS, "starting-offsets")
            if data is None:
                raise RegionalStoreError(f"{self.storage.describe(_STARTING_OFFSETS)} vanished right after it was "
                                         "written: is another process removing files of the regional store?")
        try:
            return {str(r): int(o) for r, o in data.items()}
        except (TypeError, ValueError, AttributeError) as exc:
            raise self._corrupt(_STARTING_OFFSETS, f"{type(exc).__name__}: {exc}") from None

    def created_at(self) -> float | None:
        data = self._read(_QUERY, "query")
        return None if data is None else float(data.get("created_at", 0.0))

    # -- written by the JVM shim ------------------------------------------------------

    def read_query_plan(self) -> QueryPlanCheck | None:
        """The shim's plan check of the current run; None without the shim."""
        data = self._read(_QUERY_PLAN, "query-plan")
        if data is None:
            return None
        try:
            return QueryPlanCheck(bool(data["regional_epochs"]), data.get("operator"), data.get("reason"))
        except (KeyError, TypeError) as exc:
            raise self._corrupt(_QUERY_PLAN, f"{type(exc).__name__}: {exc}") from None

    def plan_allows_regional_epochs(self) -> bool:
        """False when the shim found an operator that mixes regions between tasks (all-or-nothing epochs)."""
        check = self.read_query_plan()
        return check is None or check.regional_epochs

    def read_failures(self, epoch: int) -> dict[int, list[TaskFailure]]:
        """Failed task attempts of ``epoch`` by partition, oldest attempt first."""
        failures: dict[int, list[TaskFailure]] = {}
        for info in sorted(self.storage.list(f"{_FAILURES}/{epoch}"), key=lambda i: i.name):
            if not _FAILURE_NAME.match(info.name.rpartition("/")[2]):
                continue
            data = self._read(info.name, "failure")
            if data is None:
                continue
            try:
                description = data.get("description")
                failure = TaskFailure(int(data["partition"]), int(data["attempt"]), str(data["executor"]),
                                      str(data["exception_class"]), str(data["message"]),
                                      description if isinstance(description, str) else None)
            except (KeyError, TypeError, ValueError) as exc:
                raise self._corrupt(info.name, f"{type(exc).__name__}: {exc}") from None
            failures.setdefault(failure.partition, []).append(failure)
        return {p: sorted(fs, key=lambda f: f.attempt) for p, fs in failures.items()}

    # -- a source's own state --------------------------------------------------------------

    def source_log(self, source: str) -> SourceLog:
        """The durable state of source ``source`` (a plain name, e.g. ``files``): see ``store.source_log``."""
        if not source.isidentifier():
            raise ValueError(f"a source log's name must be a plain name, not {source!r}")
        return SourceLog(self.storage.child(f"sources/{source}"))

    # -- graceful stop -------------------------------------------------------------------

    def request_final_epoch(self, after_epoch: int) -> None:
        files.write(self.storage, _FINAL_REQUEST, "final-epoch-request", {"after_epoch": after_epoch,
                                                                         "requested_at": time.time()})

    def final_epoch_requested_since(self, since: float) -> bool:
        """A graceful stop asked for a final global epoch at or after ``since`` (a stale request
        left by a driver that died while stopping is ignored by the next run)."""
        data = self._read(_FINAL_REQUEST, "final-epoch-request")
        return data is not None and float(data.get("requested_at", 0)) >= since

    def clear_final_epoch_request(self) -> None:
        self.storage.delete(_FINAL_REQUEST)

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
                self.storage.delete(f"{_EPOCHS}/{_name(epoch)}")
        for epoch in self._numbered(_INTENTS):
            if epoch <= epochs[-1]:
                self.storage.delete(f"{_INTENTS}/{_name(epoch)}")
        for info in self.storage.list(_FAILURES, recursive=True):
            per_epoch = info.name.split("/")[1]
            if per_epoch.isdigit() and int(per_epoch) <= epochs[-1]:
                self.storage.delete(info.name)
        if self.location.is_local:  # the emptied directories of the failures
            for directory in (self.root / _FAILURES).glob("[0-9]*"):
                if directory.name.isdigit() and int(directory.name) <= epochs[-1]:
                    shutil.rmtree(directory, ignore_errors=True)

    # -- reading -------------------------------------------------------------------------------

    def _read(self, name: str, kind: str) -> Any | None:
        return files.read(self.storage, name, kind)

    def _corrupt(self, name: str, why: str) -> RegionalStoreError:
        return files.corrupt(self.storage.describe(name), why)

    def _read_epoch_file(self, name: str, kind: str, epoch: int, parse: Callable[[Any], T],
                         epoch_of: Callable[[T], int]) -> T | None:
        """A per-epoch store file, parsed; it must be the one of ``epoch``."""
        data = self._read(name, kind)
        if data is None:
            return None
        try:
            value = parse(data)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise self._corrupt(name, f"{type(exc).__name__}: {exc}") from None
        if epoch_of(value) != epoch:
            raise self._corrupt(name, f"it holds the {kind} of epoch {epoch_of(value)}, not of epoch {epoch}")
        return value

    def _numbered(self, directory: str) -> list[int]:
        """The numbers of the ``<n>.json`` files in ``directory``, ascending (temporaries, ``.``-names, skipped)."""
        numbers = []
        for info in self.storage.list(directory):
            name = info.name.rpartition("/")[2]
            stem, _dot, ext = name.partition(".")
            if not name.startswith(".") and ext == "json" and stem.isdigit():
                numbers.append(int(stem))
        return sorted(numbers)


def _describe_holder(holder: dict[str, Any]) -> str:
    try:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder["since"])))
        return f"process {int(holder['pid'])} on {holder['host']}, since {since}"
    except (ValueError, KeyError, TypeError):
        return "its process left no name"


def _name(epoch: int) -> str:
    return f"{epoch:012d}.json"
