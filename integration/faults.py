"""Targets that really fail, for the integration tests (loaded as python:integration.faults:<Class>).

State that must outlive one task or one process lives in files under ``faultDir``.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from regional.targets.delta import DeltaTarget
from regional.targets.postgres import PostgresTarget


def _epochs(text: str) -> set[int]:
    return {int(x) for x in text.split(",") if x.strip()}


class FlakyDelta(DeltaTarget):
    """The real Delta committer, whose ``prepare`` raises for ``failRegion`` in the epochs
    listed by ``failEpochs``, or while the file ``failWhileExists`` exists."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.fail_region = options.get("failregion", "")
        self.fail_epochs = _epochs(options.get("failepochs", ""))
        self.fail_marker = options.get("failwhileexists")
        self.worker_log = options.get("workerlog")  # a file: one line per prepare, "<epoch> <region> <pid>"

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Any:
        if self.worker_log:
            with open(self.worker_log, "a") as f:
                f.write(f"{epoch} {region} {os.getpid()}\n")
        if region == self.fail_region and (
            epoch in self.fail_epochs or (self.fail_marker and os.path.exists(self.fail_marker))
        ):
            raise ConnectionError(f"shard of region {region} is down (injected, epoch {epoch})")
        return super().prepare(epoch, region, batches)


class JsonLinesTarget:
    """A plain duck-typed committer: stages JSON lines per region, publishes by rename."""

    def __init__(self, options: dict[str, str]) -> None:
        self.root = Path(options["path"])
        self.fail_region = options.get("failregion", "")

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> str:
        if region == self.fail_region:
            raise ValueError(f"cannot stage region {region}")
        staging = self.root / "_staging"
        staging.mkdir(parents=True, exist_ok=True)
        name = f"{epoch}-{abs(hash(region))}-{os.getpid()}-{id(self)}.jsonl"
        with open(staging / name, "w") as f:
            for batch in batches:
                for row in batch.to_pylist():
                    f.write(json.dumps(row) + "\n")
        return name

    def commit(self, epoch: int, handles: dict[str, Any]) -> None:
        for name in handles.values():
            if (self.root / "_staging" / name).exists():
                os.replace(self.root / "_staging" / name, self.root / name)

    def abort(self, epoch: int, handles: dict[str, Any]) -> None:
        for name in handles.values():
            (self.root / "_staging" / name).unlink(missing_ok=True)


class NotifiedDelta(FlakyDelta):
    """FlakyDelta that logs every region-level notification it receives to ``notifyLog``."""

    def on_epoch(self, epoch: int, committed: dict[str, tuple[int, int]],
                 fallen_back: dict[str, tuple[int, str]]) -> None:
        with open(self.options["notifylog"], "a") as f:
            f.write(json.dumps({"epoch": epoch, "committed": committed, "fallen_back": fallen_back}) + "\n")


class KillingPostgres(PostgresTarget):
    """The real PostgreSQL committer whose Python worker SIGKILLs itself, once each (marker files under
    ``faultDir``), for ``killRegion``: in the middle of its COPY (``mid-copy``), then right after its
    PREPARE TRANSACTION (``after-prepare``), leaving a prepared transaction whose locks nobody releases."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.kill_region = options.get("killregion", "")
        self.fault_dir = Path(options.get("faultdir", "."))

    def _once(self, name: str) -> bool:
        try:
            (self.fault_dir / name).open("x").close()
            return True
        except FileExistsError:
            return False

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Any:
        if region != self.kill_region:
            return super().prepare(epoch, region, batches)

        def then_kill() -> Iterator[pa.RecordBatch]:
            yield from batches
            if self._once("mid-copy"):  # the COPY has begun and is not finished
                os.kill(os.getpid(), signal.SIGKILL)

        handle = super().prepare(epoch, region, then_kill())
        if self._once("after-prepare"):
            os.kill(os.getpid(), signal.SIGKILL)
        return handle


class TwinAttemptPostgres(PostgresTarget):
    """The real PostgreSQL committer, where ``twinRegion``'s task in each epoch of ``twinEpochs`` also stages
    its slice a second time as *another attempt* of the same task and run (its TaskContext swapped for one
    with another task attempt id), after its own PREPARE, and returns its own handle: the chosen attempt.
    ``twin=zombie``: the other attempt is an earlier one (a lower task attempt id: a task on an executor
    Spark lost, still running). ``twin=speculative``: a later one, with ``spark.speculation=true``. Each twin's
    gid goes, one JSON line, into ``faultDir/twins``."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.twin_region = options.get("twinregion", "")
        self.twin_epochs = _epochs(options.get("twinepochs", ""))
        self.twin = options.get("twin", "zombie")
        self.fault_dir = Path(options.get("faultdir", "."))

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Any:
        if region != self.twin_region or epoch not in self.twin_epochs:
            return super().prepare(epoch, region, batches)
        from pyspark import TaskContext

        kept = list(batches)
        handle = super().prepare(epoch, region, iter(kept))
        real = TaskContext.get()
        assert real is not None
        other = object.__new__(TaskContext)
        other._partitionId, other._stageId, other._attemptNumber = real.partitionId(), real.stageId(), 1
        other._cpus, other._resources = real.cpus(), real.resources()
        props = dict(real._localProperties or {})
        if self.twin == "zombie":
            other._taskAttemptId = real.taskAttemptId() - 1
        else:
            other._taskAttemptId = real.taskAttemptId() + 1000
            props["spark.speculation"] = "true"
        other._localProperties = props
        TaskContext._setTaskContext(other)
        try:
            twin = super().prepare(epoch, region, iter(kept))
        finally:
            TaskContext._setTaskContext(real)
        with open(self.fault_dir / "twins", "a") as f:
            f.write(json.dumps({"epoch": epoch, "chosen": handle["gid"], "twin": twin["gid"]}) + "\n")
        return handle
