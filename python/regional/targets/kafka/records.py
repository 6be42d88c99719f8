"""target=kafka's rows as Kafka records: the columns Spark's Kafka sink takes, checked as Spark checks them, and
what makes one row a record Kafka will refuse (its own fault, so the row is dead-lettered, never the epoch).

Columns (Spark's): ``value`` (string or binary, required; null: a tombstone), ``key`` (string or binary),
``headers`` (``array<struct<key: string, value: binary>>``), ``topic`` (string; the ``topic`` option wins over
it), ``partition`` (int; null or absent: the partitioner on the key). Other columns are ignored, as Spark
ignores them. A staged slice holds exactly these five, as ``STAGED``: strings as their UTF-8 bytes.

Pure: no Kafka client, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from regional.errors import RegionalConfigError
from regional.targets.base import RowsInvalid

HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
STAGED = pa.schema([pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("headers", HEADERS),
                    pa.field("topic", pa.string()), pa.field("partition", pa.int32())])
BATCH_OVERHEAD = 61  # a v2 record batch's header: the broker checks max.message.bytes against the whole batch
# librdkafka's RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD: a record's length, attributes, timestamp and offset deltas, key and
# value lengths and header count at their largest varints (5 + 1 + 10 + 5 + 5 + 5 + 5)
PRODUCER_OVERHEAD = 36
MAX_TOPIC_NAME = 249  # Kafka's Topic.MAX_NAME_LENGTH


def check_columns(schema: pa.Schema, topic_option: str | None) -> None:
    """At start, on the driver: the query's columns as Spark's Kafka sink checks them (its messages)."""
    names = schema.names
    if "value" not in names:
        raise RegionalConfigError("target=kafka: Required attribute 'value' not found (as Spark's Kafka sink): "
                                  "select a 'value' column (string or binary)")
    for name in ("value", "key"):
        if name in names and not _text_or_bytes(schema.field(name).type):
            raise RegionalConfigError(f"target=kafka: {name} attribute type must be a string or binary (it is "
                                      f"{schema.field(name).type}): cast it, e.g. col('{name}').cast('string')")
    if "topic" in names and not _text(schema.field("topic").type):
        raise RegionalConfigError(f"target=kafka: topic attribute type must be a string (it is "
                                  f"{schema.field('topic').type})")
    if topic_option is None and "topic" not in names:
        raise RegionalConfigError("target=kafka: topic option required when no 'topic' attribute is present: add "
                                  ".option('topic', ...) or a 'topic' column")
    if "partition" in names and not pa.types.is_int32(schema.field("partition").type):
        raise RegionalConfigError(f"target=kafka: partition attribute type must be an int (it is "
                                  f"{schema.field('partition').type}): cast it, e.g. col('partition').cast('int')")
    if "headers" in names and not _headers_type(schema.field("headers").type):
        raise RegionalConfigError(f"target=kafka: headers attribute type must be an array of structs of a string 'key' "
                                  f"and a binary 'value', as the Kafka source gives them (it is "
                                  f"{schema.field('headers').type})")


def staged_batch(batch: pa.RecordBatch, topic_option: str | None) -> pa.RecordBatch:
    """``batch`` (the query's columns) as ``STAGED``: the topic option over the column, strings as bytes."""
    rows = batch.num_rows

    def column(name: str, kind: pa.DataType) -> pa.Array:
        if name not in batch.schema.names:
            return pa.nulls(rows, kind)
        values = batch.column(name)
        if kind == pa.binary() and not pa.types.is_binary(values.type):
            return pc.cast(values, pa.binary())  # string -> its UTF-8 bytes, as Spark's sink writes it
        return values.cast(kind) if values.type != kind else values

    topic = pa.array([topic_option] * rows, pa.string()) if topic_option is not None else column("topic", pa.string())
    return pa.RecordBatch.from_arrays([column("key", pa.binary()), column("value", pa.binary()),
                                       column("headers", HEADERS), topic, column("partition", pa.int32())],
                                      schema=STAGED)


def illegal_topic(name: str) -> str | None:
    """Why Kafka can never have a topic of this name (its ``Topic.validate``), or None. Such a topic is never
    created: a row naming one is its own fault, not a topic missing for now."""
    if name in ("", ".", ".."):
        return f"the topic name {name!r} is illegal in Kafka"
    if len(name) > MAX_TOPIC_NAME:
        return f"a topic name of {len(name)} characters is illegal in Kafka (at most {MAX_TOPIC_NAME})"
    bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c in "._-"))})
    if bad:
        return (f"the topic name {name[:80]!r} holds {''.join(bad)[:20]!r}: Kafka's topic names take only ASCII "
                "letters, digits, '.', '_' and '-'")
    return None


@dataclass(frozen=True)
class TopicFacts:
    partitions: int
    max_batch_bytes: int  # the topic's max.message.bytes (what the broker takes per record batch)


CODEC_FRAMING = 64  # what a codec's own framing may add beyond pyarrow's measure of it (Kafka's snappy: xerial)


def refusal(batch: pa.RecordBatch, topics: Mapping[str, TopicFacts], max_message_bytes: int,
            codec: str | None) -> RowsInvalid | None:
    """Why Kafka would refuse a row of ``batch`` (``STAGED``), as the first such row's own fault, or None.
    ``topics``: every topic the batch names; ``max_message_bytes``: the producer's ``message.max.bytes``; ``codec``:
    the producer's ``compression.type`` (None: none): the broker checks a batch's compressed size, so a record over
    the topic's limit uncompressed is compressed here with the same codec to tell."""
    topic_col = batch.column("topic")
    if topic_col.null_count:
        row = topic_col.to_pylist().index(None)
        return RowsInvalid(f"null topic present in the data (row {row} of the slice). Use the topic option for "
                           "setting a topic (Spark's Kafka sink refuses it the same way)")
    suspects = _may_be_refused(batch, topics, max_message_bytes)
    if not len(suspects):
        return None
    # The rows a bound cannot clear: checked one by one, exactly.
    return exact_refusal(batch.take(pa.array(suspects)), topics, max_message_bytes, codec)


def exact_refusal(batch: pa.RecordBatch, topics: Mapping[str, TopicFacts], max_message_bytes: int,
                  codec: str | None) -> RowsInvalid | None:
    """``refusal``'s rules, row by row (``batch``: ``STAGED``, no null topic)."""
    headers = batch.column("headers").to_pylist()
    for i, (topic, key, value, partition) in enumerate(_rows(batch)):
        facts = topics[topic]
        if partition is not None and not 0 <= partition < facts.partitions:
            return RowsInvalid(f"partition {partition} of topic {topic!r} does not exist (it has {facts.partitions} "
                               "partitions): Kafka refuses the record")
        pairs = headers[i] or []
        if any(h["key"] is None for h in pairs):
            return RowsInvalid("a header with a null key: Kafka refuses the record (header keys are strings)")
        size = batch_bytes(key, value, pairs)
        if size > facts.max_batch_bytes and codec is not None:  # alone in its batch, compressed
            size = compressed_batch_bytes(key, value, pairs, codec)
        if producer_bytes(key, value, pairs) > max_message_bytes or size > facts.max_batch_bytes:
            return RowsInvalid(
                f"a record of {size:,} bytes for topic {topic!r} is larger than Kafka takes (the producer's "
                f"message.max.bytes {max_message_bytes:,}; the topic's max.message.bytes {facts.max_batch_bytes:,}): "
                "RecordTooLargeException. Raise the topic's max.message.bytes and kafka.max.request.size, or make "
                "the record smaller")
    return None


# A v2 record's own fields at most (length, attributes, timestamp and offset deltas, key and value lengths, header
# count), and a header's two lengths at most: the bounds that clear most rows without looking at them one by one.
RECORD_FIELDS_MAX = 5 + 1 + 10 + 5 + 5 + 5 + 5
HEADER_FIELDS_MAX = 10


def _may_be_refused(batch: pa.RecordBatch, topics: Mapping[str, TopicFacts], max_message_bytes: int) -> np.ndarray:
    """The rows of ``batch`` (``STAGED``, no null topic) that upper bounds of their size, their partition and their
    headers cannot clear, by column (a loop over every row in Python cost more than the rest of a task)."""
    rows = batch.num_rows
    lengths = np.zeros(rows, dtype=np.int64)
    for name in ("key", "value"):
        lengths += pc.fill_null(pc.binary_length(batch.column(name)), 0).to_numpy(zero_copy_only=False)
    headers = batch.column("headers")
    count = pc.fill_null(pc.list_value_length(headers), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    null_key = np.zeros(rows, dtype=bool)
    if headers.null_count < rows and count.sum():
        flat = pc.list_flatten(headers)
        parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
        keys, values = flat.field("key"), flat.field("value")
        sizes = (pc.fill_null(pc.binary_length(keys), 0).to_numpy(zero_copy_only=False)
                 + pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False))
        lengths += np.bincount(parents, weights=sizes, minlength=rows).astype(np.int64)
        null_key[parents[keys.is_null().to_numpy(zero_copy_only=False)]] = True
    fields = RECORD_FIELDS_MAX + HEADER_FIELDS_MAX * count
    facts = list(topics.values())
    too_large = ((BATCH_OVERHEAD + fields + lengths > min(f.max_batch_bytes for f in facts))
                 | (PRODUCER_OVERHEAD + fields + lengths > max_message_bytes))
    partition = batch.column("partition")
    bad_partition = np.zeros(rows, dtype=bool)
    if partition.null_count < rows:
        given = pc.fill_null(partition, 0).to_numpy(zero_copy_only=False)
        bad_partition = partition.is_valid().to_numpy(zero_copy_only=False) & (
            (given < 0) | (given >= min(f.partitions for f in facts)))
    return np.flatnonzero(too_large | bad_partition | null_key)


def compressed_batch_bytes(key: bytes | None, value: bytes | None, headers: list[dict[str, object]],
                           codec: str) -> int:
    """About the bytes of a one-record batch compressed with ``codec`` (gzip, snappy, lz4, zstd: pyarrow holds the
    same codecs), a little over rather than under: the record's fields compressed, the batch header, the framing."""
    data = b"".join([key or b"", value or b""] + [str(h["key"]).encode() + bytes(h["value"] or b"")  # type: ignore[call-overload]
                                                  for h in headers])
    packed = pa.compress(data, codec=codec, asbytes=True)
    return BATCH_OVERHEAD + 16 + len(headers) * 4 + len(packed) + CODEC_FRAMING


def _rows(batch: pa.RecordBatch) -> Iterator[tuple[str, bytes | None, bytes | None, int | None]]:
    yield from zip(batch.column("topic").to_pylist(), batch.column("key").to_pylist(),
                   batch.column("value").to_pylist(), batch.column("partition").to_pylist(), strict=True)


def producer_bytes(key: bytes | None, value: bytes | None, headers: list[dict[str, object]]) -> int:
    """What librdkafka's ``produce`` compares with the producer's ``message.max.bytes`` (it refuses a larger record
    at once, MSG_SIZE_TOO_LARGE): the record's key, value and serialised headers plus ``PRODUCER_OVERHEAD``, the
    largest a v2 record's own fields can take (rd_kafka_msg_max_wire_size)."""
    hdrs = sum(_field(str(h["key"]).encode()) + _field(h["value"]) for h in headers)  # type: ignore[arg-type,misc]
    return PRODUCER_OVERHEAD + len(key or b"") + len(value or b"") + hdrs


def batch_bytes(key: bytes | None, value: bytes | None, headers: list[dict[str, object]]) -> int:
    """The bytes of a v2 record batch holding this one record, uncompressed (KIP-98's format): what the broker
    compares with the topic's ``max.message.bytes`` when the record is alone in its batch."""
    body = 1 + 1 + 1  # attributes, timestamp delta 0, offset delta 0
    body += _field(key) + _field(value) + _varint_size(len(headers))
    for header in headers:
        body += _field(str(header["key"]).encode()) + _field(header["value"])  # type: ignore[arg-type]
    return BATCH_OVERHEAD + _varint_size(body) + body


def _field(data: bytes | None) -> int:
    return 1 if data is None else _varint_size(len(data)) + len(data)  # null: length -1, one byte


def _varint_size(n: int) -> int:
    zigzag = (n << 1) ^ (n >> 63)
    size = 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def _text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _text_or_bytes(kind: pa.DataType) -> bool:
    return _text(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _headers_type(kind: pa.DataType) -> bool:
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_struct(kind.value_type):
        return False
    fields = {f.name: f.type for f in kind.value_type}
    return (set(fields) == {"key", "value"} and _text(fields["key"])
            and (pa.types.is_binary(fields["value"]) or pa.types.is_large_binary(fields["value"])))
