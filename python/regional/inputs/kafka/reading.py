"""source=kafka's task side: the columns of a record (Spark's Kafka source's, in Spark's order, then ``region``),
and the librdkafka consumers a Python worker keeps across tasks."""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa

from regional.errors import RegionalError
from regional.inputs.base import BATCH_BYTES
from regional.switches import switched_on

log = logging.getLogger("regional.kafka")
# librdkafka's own log lines (reconnects, retries): quiet unless a user turns this logger up. Failures that
# matter reach regional as errors, each with its own message.
client_log = logging.getLogger("regional.kafka.client")
if client_log.level == logging.NOTSET:
    client_log.setLevel(logging.CRITICAL)

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
# Spark's Kafka source's columns in Spark's order (code that relies on position, union or toDF, works as with Spark's
# source), headers with includeHeaders, then regional's region. ``offset`` is Spark's own column.
SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("region", pa.string()),
])
SCHEMA_WITH_HEADERS = pa.schema([*list(SCHEMA)[:-1], pa.field("headers", HEADERS), SCHEMA.field("region")])
SCHEMA_DDL = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
              "timestampType INT, region STRING")
SCHEMA_WITH_HEADERS_DDL = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
                           "timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, region STRING")

FIRST_LOT = 100  # records asked for before their size is known (then: a batch's bytes' worth at the largest)
FETCH_WAIT_MS = "10"  # fetch.wait.max.ms of the tasks' consumers, unless kafka.fetch.wait.max.ms says otherwise
STALE_CONSUMER_S = 5.0  # a pooled consumer silent this long within a read is replaced by a new one, once


class KafkaError(RegionalError):
    """The broker did not answer, or answered with an error regional cannot read past."""


@dataclass(frozen=True)
class PartitionSplit:
    topic: str
    partition: int


class ConsumerPool:
    """librdkafka consumers kept in a Python worker across tasks and epochs (Spark reuses its Python workers, and
    Spark's own Kafka source pools its consumers per executor the same way): a task assigns an idle consumer its
    range instead of creating one, which costs a client's start, its bootstrap connection and a metadata request.
    A consumer serves one read at a time; one whose read did not end cleanly (an error, a task cancelled) is
    closed, never reused. An idle consumer has no assignment, so it fetches nothing. Keyed by the client
    configuration: a query whose options changed gets new ones; at most ``limit`` idle consumers in all (the
    least recently used go first). ``REGIONAL_KAFKA_POOL=off`` in the workers' environment turns it off (a
    consumer per task, as before), for benchmarks.kafka_partitions to measure what it saves."""

    def __init__(self, limit: int = 4) -> None:
        self._idle: list[tuple[str, Any]] = []  # (key, consumer), least recently used first
        self._lock = threading.Lock()
        self._limit = limit if switched_on("REGIONAL_KAFKA_POOL") else 0
        self.created = 0  # consumers this process created (tests read it)

    @staticmethod
    def _key(conf: Mapping[str, Any]) -> str:
        return repr(sorted((k, repr(v)) for k, v in conf.items() if k != "logger"))

    def take(self, conf: Mapping[str, Any], fresh: bool = False) -> tuple[Any, bool]:
        """A consumer for ``conf``, and whether it served an earlier read."""
        key = self._key(conf)
        with self._lock:
            if not fresh:
                for i in range(len(self._idle) - 1, -1, -1):
                    if self._idle[i][0] == key:
                        return self._idle.pop(i)[1], True
            self.created += 1
        from confluent_kafka import Consumer

        return Consumer(dict(conf)), False

    def give_back(self, conf: Mapping[str, Any], consumer: Any, reusable: bool) -> None:
        if consumer is None:  # closed already (replaced mid-read, and its successor never came)
            return
        if reusable:
            try:
                consumer.unassign()  # nothing fetched while idle, and no prefetched records carried to the next range
            except Exception:
                reusable = False
        evicted = []
        if reusable and self._limit:
            with self._lock:
                self._idle.append((self._key(conf), consumer))
                while len(self._idle) > self._limit:
                    evicted.append(self._idle.pop(0)[1])
        else:
            evicted.append(consumer)
        for old in evicted:
            old.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for _key, consumer in idle:
            consumer.close()


CONSUMERS = ConsumerPool()
atexit.register(CONSUMERS.close)


class _Rows:
    """Columns of one batch, filled from lots of messages. librdkafka hands out one object per message, so
    each column is one comprehension over the lot; timestamps are converted in Arrow, not per row."""

    def __init__(self, region: str, split: PartitionSplit, headers: bool, batch_bytes: int = BATCH_BYTES) -> None:
        self.region, self.split, self.with_headers = region, split, headers
        self.batch_bytes = batch_bytes
        self.next_offset: int | None = None
        self.largest = -1  # over the whole read: at least any record's bytes (-1: none read yet)
        self._clear()

    def _clear(self) -> None:
        self.offsets: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.value_sizes: list[np.ndarray] = []  # per lot: each value's length (0 for null), for the column's offsets
        self.null_values = False
        self.stamps: list[tuple[int, int]] = []
        self.headers: list[Any] = []
        self.nbytes = 0  # keys', values' and headers' bytes

    def __len__(self) -> int:
        return len(self.offsets)

    def lot_size(self, wanted: int) -> int:
        """How many records to ask librdkafka for next: ``wanted``, but no more than fill a batch at the largest
        record read so far (none yet: ``FIRST_LOT``, to learn their size)."""
        if self.largest < 0:
            return max(1, min(wanted, FIRST_LOT))
        return max(1, min(wanted, self.batch_bytes // max(self.largest, 1)))

    def add(self, records: list[Any], offsets: list[int], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        """Takes a lot of records, yielding a batch each time the next record would take the rows past
        ``batch_bytes`` (a record larger than that is a batch of its own). The rest stays for the next lot, or
        ``batch()``."""
        if not records:
            return
        keys = [m.key() for m in records]
        values = [m.value() for m in records]
        headers = ([[{"key": k, "value": v} for k, v in h] if (h := m.headers()) else None for m in records]
                   if self.with_headers else None)
        null_values = None in values
        value_sizes = np.fromiter(map(len, values) if not null_values else (len(v or b"") for v in values),
                                  np.int64, count=len(values))
        key_sizes = [*map(len, filter(None, keys))]
        header_sizes = [_header_bytes(h) for h in headers] if headers is not None else []
        size = int(value_sizes.sum()) + sum(key_sizes) + sum(header_sizes)
        # the largest key plus the largest value (and headers): at least the largest record
        self.largest = max(self.largest, int(value_sizes.max()) + max(key_sizes, default=0)
                           + max(header_sizes, default=0))
        if self.nbytes + size <= self.batch_bytes:
            self.null_values = self.null_values or null_values
            self._append(records, offsets, keys, values, value_sizes, headers, size)
            return
        # Rare (large records): cut the lot where the batch is full.
        sizes = [int(v) + (len(k) if k else 0) + (header_sizes[i] if headers is not None else 0)
                 for i, (k, v) in enumerate(zip(keys, value_sizes, strict=True))]
        start = 0
        while start < len(records):
            stop, room = start, self.batch_bytes - self.nbytes
            while stop < len(records) and (sizes[stop] <= room or (stop == start and not self.offsets)):
                room -= sizes[stop]
                stop += 1
            part = slice(start, stop)
            self.null_values = self.null_values or null_values  # this part's perhaps: then pa.array builds it
            self._append(records[part], offsets[part], keys[part], values[part], value_sizes[part],
                         headers[part] if headers is not None else None, sum(sizes[part]))
            start = stop
            if start < len(records) or self.nbytes >= self.batch_bytes:
                yield self.batch(schema)

    def _append(self, records: list[Any], offsets: list[int], keys: list[bytes | None], values: list[bytes | None],
                value_sizes: np.ndarray, headers: list[Any] | None, size: int) -> None:
        if not records:
            return
        self.offsets += offsets
        self.keys += keys
        self.values += values
        self.value_sizes.append(value_sizes)
        self.stamps += [m.timestamp() for m in records]
        if headers is not None:
            self.headers += headers
        self.nbytes += size
        self.next_offset = offsets[-1] + 1

    def batch(self, schema: pa.Schema) -> pa.RecordBatch:
        import pyarrow.compute as pc  # here, not at import: the driver's planning processes never build a batch

        n = len(self.offsets)
        kinds = pa.array([k for k, _ in self.stamps], pa.int32())
        millis = pa.array([ms for _, ms in self.stamps], pa.int64())
        # librdkafka's kinds 0/1/2 are Java's -1 (none), 0 (CreateTime), 1 (LogAppendTime)
        stamps = pc.if_else(pc.equal(kinds, 0), None, pc.multiply(millis, 1000)).cast(pa.timestamp("us", tz="UTC"))
        columns = [
            _binary(self.keys), _binary(self.values, np.concatenate(self.value_sizes)
                                        if self.value_sizes and not self.null_values else None),
            _constant(self.split.topic, pa.string(), n), _constant(self.split.partition, pa.int32(), n),
            pa.array(self.offsets, pa.int64()), stamps, pc.subtract(kinds, 1),
        ]
        if self.with_headers:
            columns.append(pa.array(self.headers, HEADERS))
        columns.append(_constant(self.region, pa.string(), n))
        self._clear()
        return pa.RecordBatch.from_arrays(columns, schema=schema)


def _constant(value: Any, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` copies of one value, built in Arrow rather than from a Python list."""
    import pyarrow.compute as pc

    return pc.fill_null(pa.nulls(n, type_), pa.scalar(value, type_))


def _binary(items: list[bytes | None], lengths: np.ndarray | None = None) -> pa.Array:
    """A binary column of keys or values (``lengths``: theirs, given only when none is null). Without nulls its
    bytes are joined once and handed to Arrow with their offsets (about 40% less time than ``pa.array`` copying
    them one by one, measured on 200-byte values); a column with nulls goes through ``pa.array``."""
    n = len(items)
    if lengths is None and (n == 0 or None in items):
        return pa.array(items, pa.binary())
    present = cast("list[bytes]", items)
    if lengths is None:
        lengths = np.fromiter(map(len, present), dtype=np.int64, count=n)
    ends = np.cumsum(lengths)
    if ends[-1] > np.iinfo(np.int32).max:  # never under BATCH_BYTES (a record is below 2 GiB); never wrap offsets
        raise KafkaError(f"a batch of {n} records holds {ends[-1]:,} bytes of keys or values, past Arrow's 2 GiB")
    offsets = np.zeros(n + 1, dtype=np.int32)
    offsets[1:] = ends
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(present))])


def _header_bytes(headers: list[dict[str, Any]] | None) -> int:
    """One record's header keys' (as UTF-8) and values' bytes."""
    return sum(len(h["key"].encode()) + len(h["value"] or b"") for h in headers) if headers else 0


def _of(message: Any, split: PartitionSplit) -> bool:
    return bool(message.partition() == split.partition and message.topic() == split.topic)


def _offsets_of(messages: list[Any], region: str) -> list[int]:
    """Fetched records' offsets; librdkafka gives every record without an error one."""
    offsets: list[int] = [m.offset() for m in messages]
    if None in offsets:
        raise KafkaError(f"region {region!r}: librdkafka returned a record without an offset")
    return offsets
