"""Real faults for the benchmarks, importable by Python workers (``python:benchmarks.faults:<Class>``).

State shared between processes lives in files under ``faultDir``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from regional.targets.base import chain_first
from regional.targets.delta import DeltaTarget


def transient_failure(epoch: int, region: str, share: float) -> bool:
    """The same deterministic ``share`` of (epoch, region) pairs fails, in every run."""
    digest = hashlib.sha256(f"{epoch}/{region}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


class DownWhileMarked(DeltaTarget):
    """Delta, except that region ``failRegion``'s target is down while the file ``downMarker`` exists."""

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Any:
        if region == self.options.get("failregion") and os.path.exists(self.options["downmarker"]):
            raise ConnectionError(f"target of region {region} is down (benchmark fault)")
        return super().prepare(epoch, region, batches)


class FailsAfterWork(DeltaTarget):
    """Delta, except that a ``failShare`` of region-epochs fail after staging their whole slice: the work is
    done and lost. Rows of lost slices are appended to ``<faultDir>/wasted-rows``."""

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Any:
        if not transient_failure(epoch, region, float(self.options["failshare"])):
            return super().prepare(epoch, region, batches)
        first = next(batches, None)
        if first is None:
            return None
        staged = super().prepare(epoch, region, chain_first(first, batches))
        assert staged is not None  # the slice had a batch
        self.abort(epoch, {region: staged})
        wasted: int = sum(int(file["rows"]) for file in staged["files"])  # a handle lists its files
        with open(Path(self.options["faultdir"]) / "wasted-rows", "a") as f:
            f.write(f"{wasted}\n")
        raise TimeoutError(f"region {region} epoch {epoch}: target timed out after the write (benchmark fault)")
