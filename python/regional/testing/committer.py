"""``EpochFilesTarget``: a plain Python committer (``target=python:regional.testing.committer:EpochFilesTarget``).

What a user's own two-phase committer looks like, and the "python" target of the reliability campaign.
``prepare`` (in a task) stages one region's slice as a hidden JSON lines file; ``commit`` (on the driver)
publishes each region by renaming its staged file to ``<epoch>-<region>.jsonl`` under ``path``; a re-run
of ``commit`` after a crash skips what is already published. Region ids become file names only through
``encode_region``. Read back with ``regional.testing.exactly_once.epoch_files_landed``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from regional.errors import RegionalConfigError, RegionalStoreError
from regional.ids import encode_region

STAGING = "_staging"


class EpochFilesTarget:
    def __init__(self, options: dict[str, str]) -> None:
        if not options.get("path"):
            raise RegionalConfigError("EpochFilesTarget needs .option('path', <directory>)")
        self.root = Path(options["path"])

    def published_name(self, epoch: int, region: str) -> str:
        return f"{epoch:012d}-{encode_region(region)}.jsonl"

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> str:
        staging = self.root / STAGING
        staging.mkdir(parents=True, exist_ok=True)
        name = f".{epoch:012d}-{uuid.uuid4().hex}.jsonl"  # one per attempt: retries never share a file
        with open(staging / name, "w") as f:
            for batch in batches:
                for row in batch.to_pylist():
                    f.write(json.dumps(row, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return name

    def commit(self, epoch: int, handles: dict[str, str]) -> None:
        for region, name in handles.items():
            final = self.root / self.published_name(epoch, region)
            if final.exists():
                continue  # published by an earlier run of this commit
            try:
                os.replace(self.root / STAGING / name, final)
            except FileNotFoundError:
                raise RegionalStoreError(f"staged file {name} of region {region!r}, epoch {epoch}, is gone before "
                                         "it was published") from None

    def abort(self, epoch: int, handles: dict[str, str]) -> None:
        for name in handles.values():
            (self.root / STAGING / name).unlink(missing_ok=True)
