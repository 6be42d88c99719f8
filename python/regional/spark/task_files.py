"""What the source and the sink of one task tell each other, through executor-local files.

Tasks never touch the store (the checkpoint need not be reachable from executors). The source and
the sink of one task run in two Python workers of the same executor and see the same task: the
same ``taskAttemptId``, the same local properties, the same ``SPARK_LOCAL_DIRS`` (checked on Spark
4.2). So they share facts through files under the executor's local directory, keyed by
(query, epoch, partition, attempt, task attempt id):

- the **read receipt**, written by the source: what it read, ``[start, end)`` (a prefix of the range when
  cut at ``regionTimeout``), or that it quarantined the region. The sink reads it after its
  input ends (the source writes its last receipt before its last rows leave the worker) and puts
  it in its commit message. No receipt, or an unfinished one, makes the region fall back.
- the **receiving marker**, written by the sink on its first rows: the source's ``regionTimeout``
  clock starts then (Python workers between source and sink take a second or more to start).
- the **dead letter**, written by the source in the quarantined attempt of an isolated record: the
  record as read (Arrow IPC), never handed to the query; the sink puts it in its commit message.

Spark removes the executor's local directories when the executor stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from pyspark import TaskContext

from regional.ids import encode_region


@dataclass(frozen=True)
class ReadReceipt:
    """The source's account of what one task attempt read."""

    query_id: str
    epoch: int
    region: str
    start: int
    end: int | None  # exclusive end of what was read (a prefix when cut at regionTimeout); None: still reading
    quarantined: bool  # the attempt numbered regionAttempts: it read nothing, on purpose
    enabled: bool  # the plan's settings.enabled (regional epochs on: a target failure fails only the region)
    started_at: float  # wall-clock seconds when the source began reading (same host as the sink)
    probe: bool = False  # a probe's range (records beside an isolated one): the sink probes the target, never stages

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ReadReceipt:
        d = json.loads(text)
        end = d["end"]
        return cls(str(d["query_id"]), int(d["epoch"]), str(d["region"]), int(d["start"]),
                   None if end is None else int(end), bool(d["quarantined"]), bool(d["enabled"]),
                   float(d["started_at"]), bool(d.get("probe", False)))


@dataclass(frozen=True)
class TaskKey:
    spark_query_id: str
    epoch: int
    partition: int
    attempt: int
    task_attempt_id: int

    @classmethod
    def current(cls) -> TaskKey:
        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("regional: no TaskContext; this runs only inside a Spark task")
        return cls(ctx.getLocalProperty("sql.streaming.queryId") or "unknown",
                   int(ctx.getLocalProperty("streaming.sql.batchId") or -1),
                   ctx.partitionId(), ctx.attemptNumber(), ctx.taskAttemptId())


class TaskFiles:
    """The files of one task attempt."""

    def __init__(self, key: TaskKey) -> None:
        self.key = key
        self.query_dir = _local_root() / encode_region(key.spark_query_id)
        self.directory = directory = self.query_dir / str(key.epoch)
        stem = f"p{key.partition}-a{key.attempt}-t{key.task_attempt_id}"
        self.receipt_path = directory / f"{stem}.receipt"
        self.receiving_path = directory / f"{stem}.receiving"
        self.dead_letter_path = directory / f"{stem}.dead-letter"

    def write_receipt(self, receipt: ReadReceipt) -> None:
        _write_atomically(self.receipt_path, receipt.to_json().encode("utf-8"))

    def write_dead_letter(self, payload: bytes) -> None:
        _write_atomically(self.dead_letter_path, payload)

    def read_dead_letter(self) -> bytes | None:
        try:
            return self.dead_letter_path.read_bytes()
        except FileNotFoundError:
            return None

    def read_receipt(self) -> ReadReceipt | None:
        try:
            return ReadReceipt.from_json(self.receipt_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # unreadable: no account of what was read

    def mark_receiving(self) -> None:
        self.receiving_path.parent.mkdir(parents=True, exist_ok=True)
        self.receiving_path.touch()

    def receiving(self) -> bool:
        return self.receiving_path.exists()

    def remove(self) -> None:
        """The sink is done with this attempt's files; the epoch's directory goes with the last of them."""
        self.receipt_path.unlink(missing_ok=True)
        self.receiving_path.unlink(missing_ok=True)
        self.dead_letter_path.unlink(missing_ok=True)
        try:
            self.directory.rmdir()
        except OSError:
            pass  # other tasks' files are still there (or it is gone already)

    def remove_leftovers(self) -> None:
        """At the start of an attempt, in the source: the files that earlier attempts of this partition left (a
        failed attempt's sink never reads its receipt), and whatever older epochs of this query left (a task of
        a query whose plan moves rows between tasks has no sink beside it to remove its receipt)."""
        for path in self.directory.glob(f"p{self.key.partition}-a*") if self.directory.is_dir() else ():
            if not path.name.startswith(self.receipt_path.stem + "."):
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.query_dir):
                if entry.is_dir() and entry.name.lstrip("-").isdigit() and int(entry.name) < self.key.epoch - 1:
                    shutil.rmtree(entry.path, ignore_errors=True)


def _write_atomically(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}"
    tmp.write_bytes(content)
    os.replace(tmp, path)


def _local_root() -> Path:
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    return Path(dirs[0] if dirs else tempfile.gettempdir()) / "regional-tasks"


# With regionTimeout the source reads in batches this small: the clock is checked between them.
TIMED_BATCH_ROWS = 100


class SinkWatch:
    """The source's ``regionTimeout`` deadline: ``timeout`` after the sink received its first rows; if it
    receives none (still starting, or the query filters out everything read so far), the source gives up
    ``timeout + startup_grace`` after it started reading.

    Measured on Spark 4.2: the source cannot wait for the sink to catch up. With a Python UDF between them,
    one task thread moves rows source -> UDF -> sink, so what is already in the buffers between them when the
    deadline passes is still processed and published. A cut in the sink does not help either (tried): when a
    Python sink returns before reading all its input, Spark still runs the rest of the task's input through
    the operators before it (the UDF) before the task ends; the cut only discards finished work. Checked
    again: a source that waits while it is ahead of the sink stalls the task (the sink receives nothing
    until the source yields again). What bounds a straggler's epoch is planning: ``protocol.decide.timed_range``."""

    def __init__(self, files: TaskFiles, timeout: float, startup_grace: float = 10.0) -> None:
        self.files = files
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout + startup_grace
        self._started = False

    def expired(self) -> bool:
        if not self._started and self.files.receiving():
            self._started = True
            self.deadline = time.monotonic() + self.timeout
        return time.monotonic() >= self.deadline
