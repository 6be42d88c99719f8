"""Dead letters (``deadLetterPath``): the records isolated as poison, as rows for their sink.

A record whose one-record range failed upstream of the sink on every attempt is *dead-lettered*: the task's
quarantined attempt reads it from the source (it is never handed to the query's code) and returns it in its
commit message (``encode_records``); the driver's phase two (``regional.coordinator``) turns it into the
dead-letter sink's rows (``dead_letter_rows``): the source's own columns (``region``, ``offset``, then
``value``; Kafka's ``key``, ``topic``, ``partition``, ``timestamp``, ...), then ``epoch`` and ``error``
(the exception's class and message). The sink is a target (``regional.targets.dead_letter_target``).
"""

from __future__ import annotations

import pyarrow as pa

from regional.errors import RegionalConfigError, RegionalPlanError

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
    """The dead-letter sink's rows for one isolated record: checked to be that record of that region."""
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
