"""``target=python:reliability.faults:Flaky``: any target (option ``inner``), whose ``prepare`` fails for some
(epoch, region) pairs, the same ones on every attempt and every run: regions fall back while the driver is killed.

``failShare`` (0..1) is the share of (epoch, region) pairs that fail.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from regional.targets import load_target


def fails(epoch: int, region: str, share: float) -> bool:
    digest = hashlib.sha256(f"{epoch}/{region}".encode()).digest()
    return int.from_bytes(digest[:4], "big") < share * 2**32


class Flaky:
    wants_report = True  # passed on to the inner target: the soak counts fall-backs from its commit info

    def __init__(self, options: dict[str, str]) -> None:
        self.inner = load_target({**options, "target": options["inner"]})
        self.share = float(options.get("failshare", "0"))

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Any:
        if fails(epoch, region, self.share):
            raise ConnectionError(f"region {region}'s shard is down in epoch {epoch} (injected)")
        return self.inner.prepare(epoch, region, batches)

    def commit(self, epoch: int, handles: dict[str, Any], **kwargs: Any) -> None:
        self.inner.commit(epoch, handles, **kwargs)

    def abort(self, epoch: int, handles: dict[str, Any]) -> None:
        self.inner.abort(epoch, handles)

    def __getattr__(self, name: str) -> Any:  # the inner target's optional methods (published, sweep, open, ...)
        return getattr(self.inner, name)
