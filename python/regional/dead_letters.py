"""The dead-letter table (``deadLetterPath``, DESIGN.md section 3): records isolated as poison.

A record whose one-record range failed upstream of the sink on every attempt is *dead-lettered*:
the task's quarantined attempt reads it from the source (it is never handed to the query's code) and
returns it in its commit message; the driver appends it here with ``epoch`` and ``error`` (the
exception's class and message). Columns: the source's own (``region``, ``offset``, then ``value``;
Kafka's ``key``, ``topic``, ``partition``, ``timestamp``, ...), then ``epoch`` and ``error``.

The table is Delta, written through the Delta target's two phases under the epoch's write-ahead
intent: ``stage`` runs on the driver before the intent is written, ``publish`` after it (one Delta
transaction per epoch, carrying ``(regional-<query id>, epoch)``, so a re-run writes nothing twice).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from regional.errors import RegionalConfigError, RegionalPlanError
from regional.targets.base import QUERY_ID_OPTION
from regional.targets.delta import DeltaTarget

DEAD_LETTER_COLUMNS = ("epoch", "error")


def encode_records(batches: list[pa.RecordBatch], schema: pa.Schema) -> bytes:
    """Records as the source read them, for a task's commit message (Arrow IPC stream)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_records(payload: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(payload)).read_all()


def dead_letter_rows(payload: bytes, region: str, offset: int, epoch: int, error: str) -> pa.Table:
    """The dead-letter table's rows for one isolated record: checked to be that record of that region."""
    records = decode_records(payload)
    names = records.schema.names
    clash = [c for c in DEAD_LETTER_COLUMNS if c in names]
    if clash:
        raise RegionalConfigError(f"the source has columns {clash}, which the dead-letter table adds itself")
    regions = records.column("region").to_pylist() if "region" in names else []
    offsets = records.column("offset").to_pylist() if "offset" in names else []
    n = records.num_rows
    if n < 1 or set(regions) != {region} or offsets != list(range(offset, offset + n)):
        raise RegionalPlanError(f"the dead letter of region {region!r} at offset {offset} arrived as {n} row(s) of "
                                f"regions {sorted(set(map(str, regions)))[:3]}, offsets {offsets[:3]}")
    return (records.append_column("epoch", pa.array([epoch] * n, pa.int64()))
            .append_column("error", pa.array([error] * n, pa.string())))


class DeadLetterTable:
    def __init__(self, path: str, query_id: str) -> None:
        self.delta = DeltaTarget({"path": path, QUERY_ID_OPTION: query_id})
        self.path = path

    def stage(self, epoch: int, letters: Mapping[str, tuple[bytes, int, str]]) -> dict[str, Any]:
        """On the driver, before the epoch's intent: each region's dead letter (the record as read, the
        offset planned, the error) staged, its handle returned.
        Only the driver stages here, and only before an intent: anything staged already for this epoch or
        an older one is left by a driver that died before its intent, and is removed first."""
        self.delta.sweep(epoch)
        handles = {}
        for region, (payload, offset, error) in sorted(letters.items()):
            rows = dead_letter_rows(payload, region, offset, epoch, error)
            self._check_columns(rows.schema.names)
            handles[region] = self.delta.prepare(epoch, region, iter(rows.to_batches()))
        return handles

    def publish(self, epoch: int, handles: dict[str, Any]) -> None:
        """Append the staged dead letters of ``epoch``; a re-run after a crash appends nothing twice."""
        staged = [h for h in handles.values() if h is not None]
        if staged:
            self._check_columns(pa.ipc.read_schema(pa.py_buffer(base64.b64decode(staged[0]["schema"]))).names)
        self.delta.commit(epoch, handles)

    def _check_columns(self, names: list[str]) -> None:
        """A table that holds other columns (another source's dead letters) is refused: Delta files of
        another shape would be added to it unchecked."""
        have = self.delta.columns()
        if have is not None and have != names:
            raise RegionalConfigError(
                f"deadLetterPath={self.path} is a Delta table with columns {have}, but this query's dead letters have "
                f"{names}: give each source type its own dead-letter table")
