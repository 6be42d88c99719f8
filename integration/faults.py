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
