"""The letters of a dead-letter topic: one letter in the driver's index (``Letter``), what a task reads
(``TopicSplit``, ``read_letters``), and a letter as the row its source read (``letter_row``)."""

from __future__ import annotations

import base64
import datetime
import decimal
import functools
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from regional.errors import RegionalStoreError
from regional.inputs.kafka import KafkaError

HEADER = "regional."
# consume() returns when it has its messages or at this timeout: short, as a read ends at the log's end or at its
# last letter, seldom at a thousand records (measured: 0.2 s was 0.2 s per task and per index read)
POLL_S = 0.02


class Letter:
    """One dead letter in the index: where it is in the topic, and which record it was."""

    __slots__ = ("digest", "offset", "partition", "position", "region")

    def __init__(self, partition: int, position: int, region: str, offset: int, digest: int = 0) -> None:
        self.partition, self.position, self.region, self.offset = partition, position, region, offset
        self.digest = digest  # of its key, value and row: two letters of one record are the same letter twice

    @property
    def at(self) -> tuple[int, int]:
        return self.partition, self.position


@dataclass(frozen=True)
class TopicSplit:
    """The positions (partition, offset in the topic) of a range's letters, in their original offsets' order."""

    positions: tuple[tuple[int, int], ...]


def read_letters(conf: Mapping[str, Any], topic: str, region: str, start: int, end: int, split: TopicSplit,
                 poll_timeout_s: float, schema: pa.Schema) -> list[dict[str, Any]]:
    """In the task: the letters at ``split``'s positions, as rows of ``schema``, in ``split``'s order (a consumer
    of its own, ``conf``, that reads only those positions)."""
    from confluent_kafka import KafkaError as RdKafkaError
    from confluent_kafka import TopicPartition

    if not split.positions:
        return []
    wanted: dict[int, set[int]] = {}
    for p, o in split.positions:
        wanted.setdefault(p, set()).add(o)
    found: dict[tuple[int, int], Any] = {}
    reader = consumer({**conf, **{"group.id": "regional-reader", "enable.partition.eof": True,
                                       "auto.offset.reset": "error"}})
    try:
        reader.assign([TopicPartition(topic, p, min(os)) for p, os in wanted.items()])
        todo = {p: max(os) for p, os in wanted.items()}
        deadline = time.monotonic() + poll_timeout_s
        while todo:
            messages = reader.consume(num_messages=1000, timeout=POLL_S)
            for m in messages:
                error = m.error()
                if error is not None:
                    if error.code() == RdKafkaError._PARTITION_EOF:
                        if m.partition() in todo:
                            raise RegionalStoreError(
                                f"region {region!r}: the letters of [{start}, {end}) in {topic} partition "
                                f"{m.partition()} end before position {todo[m.partition()]}: deleted (retention) "
                                "or the topic was created again; they cannot be replayed")
                    elif error.code() == RdKafkaError._AUTO_OFFSET_RESET or "out of range" in str(error).lower():
                        raise RegionalStoreError(f"region {region!r}: letters of {topic} are no longer in "
                                                 f"the topic (deleted by retention?): {error}")
                    elif not error.retriable():
                        raise KafkaError(f"region {region!r}: reading {topic} failed: {error}")
                    continue
                p, position = m.partition(), m.offset()
                if position in wanted.get(p, ()):
                    found[(p, position)] = m
                if p in todo and position >= todo[p]:
                    del todo[p]
            if messages:
                deadline = time.monotonic() + poll_timeout_s
            elif time.monotonic() > deadline:
                raise KafkaError(f"region {region!r}: {topic} gave no letter for {poll_timeout_s:.0f} "
                                 "s; is the broker up? kafkaConsumer.pollTimeoutMs sets the wait")
    finally:
        reader.close()
    rows = []
    for p, o in split.positions:
        m = found.get((p, o))
        if m is None:
            raise RegionalStoreError(f"region {region!r}: the letter at {topic} partition {p} position {o} "
                                     "is gone (an aborted transaction's, or deleted): it cannot be replayed")
        row = letter_row(m, schema, topic)
        if row.get("region") != region or not (start <= int(row.get("offset", -1)) < end):
            raise RegionalStoreError(f"the letter at {topic} partition {p} position {o} is region "
                                     f"{row.get('region')!r} offset {row.get('offset')}, not one of region "
                                     f"{region!r}'s [{start}, {end}): the topic was created again")
        rows.append(row)
    return rows


def letter_row(m: Any, schema: pa.Schema, topic: str) -> dict[str, Any]:
    """A letter as the row its source read, typed by the replay's schema."""
    pairs = m.headers() or []
    headers = headers_of(m)
    own = letter_schema(headers[HEADER + "schema"])
    if HEADER + "row" in headers:  # a Kafka source's record: its key, value and own headers, then the rest
        raw = json.loads(headers[HEADER + "row"])
        raw["value"] = m.value()
        if "key" in own.names:
            raw["key"] = m.key()
        if "headers" in own.names:
            count = headers.get(HEADER + "source.headers", b"null")
            raw["headers"] = None if count == b"null" else [{"key": k, "value": v} for k, v in pairs[:int(count)]]
    else:
        raw = json.loads(m.value())
    unknown = [n for n in raw if n not in schema.names]
    if unknown:
        raise RegionalStoreError(f"the letter at {topic} partition {m.partition()} position {m.offset()} "
                                 f"has columns {unknown} this replay's schema lacks (a letter that arrived after "
                                 "the replay started, of a changed schema): start the replay again")
    return {f.name: typed(raw.get(f.name), f.type) for f in schema}


def typed(value: Any, kind: pa.DataType) -> Any:
    """A JSON value (as ``kafka_topic`` wrote it: bytes as base64, times as ISO text) as Arrow takes ``kind``."""
    if value is None or isinstance(value, bytes):
        return value
    if pa.types.is_floating(kind) and isinstance(value, str):  # NaN and infinities travel as text (Jackson's way)
        return float(value)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return base64.b64decode(value)
    if pa.types.is_timestamp(kind):
        return datetime.datetime.fromisoformat(value)
    if pa.types.is_date(kind):
        return datetime.date.fromisoformat(value)
    if pa.types.is_decimal(kind):
        return decimal.Decimal(value)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return [typed(v, kind.value_type) for v in value]
    if pa.types.is_map(kind):
        return [(typed(k, kind.key_type), typed(v, kind.item_type)) for k, v in
                (value.items() if isinstance(value, dict) else value)]
    if pa.types.is_struct(kind):
        return {kind.field(i).name: typed(value.get(kind.field(i).name), kind.field(i).type)
                for i in range(kind.num_fields)}
    return value


@functools.lru_cache(maxsize=64)  # every letter of a query carries the same few schemas
def letter_schema(header: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(header)))


def headers_of(m: Any) -> dict[str, bytes]:
    """The letter's headers by name; regional's come last, so the last of a name wins."""
    return {k: v for k, v in (m.headers() or []) if v is not None}


def read_to_end(reader: Any, topic: str, starts: Mapping[int, int], timeout_s: float, name: str,
                at_end: Callable[[int, int], None]) -> Iterator[Any]:
    """On the driver: each message of ``topic`` from ``starts`` (partition -> position) to the end of each
    partition's readable log (read by ``reader``, a consumer with ``enable.partition.eof``), in the order read.
    ``at_end(partition, position)`` hears where each partition's readable log ended (past its last record:
    transaction markers, aborted records); a message that arrives after that is left to the next read. Fails
    naming ``name`` on a lasting error, or when nothing comes for ``timeout_s``."""
    from confluent_kafka import KafkaError as RdKafkaError
    from confluent_kafka import TopicPartition

    todo = dict(starts)
    if not todo:
        return
    reader.assign([TopicPartition(topic, p, o) for p, o in todo.items()])
    deadline = time.monotonic() + timeout_s
    while todo:
        messages = reader.consume(num_messages=1000, timeout=POLL_S)
        for m in messages:
            error = m.error()
            if error is not None:
                if error.code() == RdKafkaError._PARTITION_EOF and m.partition() in todo:
                    del todo[m.partition()]
                    at_end(m.partition(), m.offset() or 0)
                elif not error.retriable():
                    raise KafkaError(f"source=deadLetters: reading {name} failed: {error}")
                continue
            if m.partition() in todo:
                yield m
        if messages:
            deadline = time.monotonic() + timeout_s
        elif time.monotonic() > deadline:
            raise KafkaError(f"source=deadLetters: {name} did not answer within {timeout_s:.0f} s "
                             "(metadataTimeoutMs); is the broker up?")


def consumer(conf: Mapping[str, Any]) -> Any:
    from confluent_kafka import Consumer

    return Consumer(dict(conf))
