"""``deadLetterTopic``: a query's dead letters produced to a Kafka topic, exactly once, in one transaction per epoch.

Options (on ``writeStream``, with the sink's): ``deadLetterTopic`` (a setting, resolved with the others in
``regional.protocol.settings``; it enters the plan and the intent, it is only a name) and the producer's
settings ``deadLetter.kafka.*``: ``deadLetter.kafka.bootstrap.servers`` (required) and every other
librdkafka producer setting by its name (``deadLetter.kafka.security.protocol``,
``deadLetter.kafka.sasl.password``, ...), as the Kafka source takes ``kafka.*``. Those stay in the
sink's options: never in the plan (Spark's offset log), the store or a log line. Regional's own:
``deadLetter.topic.partitions`` and ``deadLetter.topic.replicationFactor`` for the topic when it is
missing (created with 1 partition and the brokers' default replication factor unless they say
otherwise), ``deadLetter.timeoutMs`` (each call to the brokers, default 60 s).

One dead letter is one Kafka record. A Kafka source's record keeps its ``key`` and ``value`` (and its
headers, with ``includeHeaders``); any other source's record is the row as JSON (its columns: ``region``,
``offset``, ``value``, ...; bytes as base64) with no key. Headers, in Kafka Connect's style (UTF-8 text):
``regional.error.class``, ``regional.error.message``, ``regional.region``, ``regional.offset``,
``regional.epoch``, ``regional.query.id`` and, where the source has them, ``regional.source.topic``,
``regional.source.partition``, ``regional.source.offset`` (Connect's ``__connect.errors.topic`` ...).
Then what a replay (``source=deadLetters`` with ``topic``, ``regional.inputs.deadletter_topic``) needs to
give the row back exactly: ``regional.schema`` (the source columns' Arrow schema: IPC bytes, base64) and, for a Kafka
source's record, ``regional.row`` (its other columns as JSON: region, offset, topic, partition, timestamp,
...) and ``regional.source.headers`` (how many of the record's headers, first, are its own).

Exactly once, across this topic and the target (Kafka Streams' exactly-once idea): ``prepare`` runs on the
driver before the intent and keeps the rows in the handle (base64 Arrow IPC; at most
``maxDeadLettersPerEpoch`` records), so the intent carries them. ``commit`` produces the epoch's records in
one transaction under the transactional id ``regional-<query id>-deadletters``, and in that same
transaction commits, for the consumer group of the same name, offset ``epoch + 1`` on the topic's
partition 0 (a marker: no one consumes with that group). A re-run first calls ``init_transactions``,
which fences a zombie producer of the query and settles its open transaction (aborted unless it was
already committing), then reads the marker (a stable read): an epoch it covers is already in the topic
and nothing is produced again. ``abort`` and ``sweep`` have nothing to do: nothing is staged outside the
transaction, and a transaction never committed is aborted by the next ``init_transactions`` or the
broker's ``transaction.timeout.ms``; ``read_committed`` consumers never see its records.

The marker lives as long as the group's committed offsets (the brokers' ``offsets.retention.minutes``,
7 days by default, counted from the last commit) and the topic: a driver that dies between the topic's
transaction and the epoch's record and restarts after that would produce the epoch's letters again.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from regional.dead_letters import decode_records, encode_records
from regional.errors import RegionalConfigError, RegionalError
from regional.options import Option, OptionTable
from regional.protocol.settings import parse_int
from regional.targets.base import EpochReport, Target
from regional.targets.kafka.transaction import SIZE_TOO_LARGE, EpochTransaction, send

log = logging.getLogger("regional.kafka")

PRODUCER_PREFIX = "deadletter.kafka."
HEADER = "regional."
# Producer settings regional sets itself, and why.
REFUSED = {
    "transactional.id": "regional names the transactions after the query (regional-<query id>-deadletters)",
    "enable.idempotence": "regional's transactions need it on",
    "group.id": "regional's marker group is named after the query",
    "key.serializer": "nothing (the key is kept as the source read it)",
    "value.serializer": "nothing (the value is kept as the source read it, or the row as JSON)",
    "interceptor.classes": "nothing (Java producer interceptors do not exist here)",
}

# writeStream's options for a dead-letter topic (checked by the sink at start, with the other tables).
DEAD_LETTER_TOPIC_OPTIONS = OptionTable("the dead-letter topic", [
    Option("deadLetter.kafka.", "", "Every librdkafka producer setting of the dead-letter topic, by its name "
                                    "(`deadLetter.kafka.bootstrap.servers` is required with `deadLetterTopic`); "
                                    "never stored, logged or put into the plan.", prefix=True),
    Option("deadLetter.topic.partitions", "1", "Partitions of the dead-letter topic when regional creates it."),
    Option("deadLetter.topic.replicationFactor", "-1", "Its replication factor when regional creates it (-1: the "
                                                       "brokers' default)."),
    Option("deadLetter.timeoutMs", "60000", "Each call to the dead-letter topic's brokers, in milliseconds."),
])

Headers = list[tuple[str, str | bytes | None]]


class KafkaDeadLetterError(RegionalError):
    """The dead-letter topic's brokers did not take the epoch's dead letters: the epoch is not recorded, and the
    next start produces them (once)."""


def transactional_id(query_id: str) -> str:
    return f"regional-{query_id}-deadletters"


class DeadLetterTopic(Target[str]):
    """The dead letters of one query, to one topic. Built on the driver only (by the coordinator's sink factory)."""

    def __init__(self, topic: str, query_id: str, options: Mapping[str, str]) -> None:
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            raise RegionalConfigError("deadLetterTopic needs confluent-kafka: pip install "
                                      "'pyspark-regional[kafka]'") from None
        super().__init__({})  # the producer's settings are kept apart, never in self.options (credentials)
        opts = {k.lower(): str(v) for k, v in options.items()}
        self.topic, self.query_id = topic, query_id
        self.group = self.transactional_id = transactional_id(query_id)
        self._conf = {k[len(PRODUCER_PREFIX):]: v for k, v in opts.items() if k.startswith(PRODUCER_PREFIX)}
        self.bootstrap = self._conf.get("bootstrap.servers", "")
        if not self.bootstrap:
            raise RegionalConfigError(f"deadLetterTopic={topic} needs its brokers: add .option('deadLetter.kafka."
                                      "bootstrap.servers', 'host:9092') to writeStream")
        for key, instead in REFUSED.items():
            if key in self._conf:
                raise RegionalConfigError(f"deadLetterTopic does not take 'deadLetter.kafka.{key}': {instead}")
        self.partitions = parse_int(opts, "deadLetter.topic.partitions", minimum=1, default="1")
        self.replication = int(opts.get("deadletter.topic.replicationfactor", "-1").strip() or "-1")
        if self.replication == 0 or self.replication < -1:
            raise RegionalConfigError("deadLetter.topic.replicationFactor must be at least 1 (or -1: the brokers' "
                                      "default.replication.factor)")
        self.timeout_s = parse_int(opts, "deadLetter.timeoutMs", minimum=1, default="60000") / 1000
        self.transaction = EpochTransaction(self.transactional_id, self._conf, query_id, self.timeout_s,
                                            failpoint="dead_letters")

    def __repr__(self) -> str:  # never the producer's settings
        return f"DeadLetterTopic({self.topic!r}, brokers={self.bootstrap!r})"

    def _where(self) -> str:
        return f"deadLetterTopic={self.topic} (deadLetter.kafka.bootstrap.servers={self.bootstrap})"

    def check(self) -> None:
        """At the sink's start: a ``deadLetter.kafka.*`` key librdkafka does not know fails here, naming it (the
        brokers are not asked)."""
        from confluent_kafka import KafkaException, Producer

        try:
            Producer(self._producer_conf()).flush(0)
        except (KafkaException, ValueError, TypeError) as exc:
            raise RegionalConfigError(f"deadLetterTopic: a deadLetter.kafka.* option is not a producer setting: "
                                      f"{exc}") from None

    def _producer_conf(self) -> dict[str, Any]:
        return self.transaction.producer_conf()

    def _consumer_conf(self) -> dict[str, Any]:
        return self.transaction.consumer_conf()

    # -- staging, on the driver before the intent ------------------------------------------------------

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> str:
        """The dead letter's rows, in the handle itself (base64 Arrow IPC): the intent carries them to a re-run."""
        table = pa.Table.from_batches(list(batches))
        return base64.b64encode(encode_records(table.to_batches(), table.schema)).decode("ascii")

    # -- publishing ------------------------------------------------------------------------------------

    def commit(self, epoch: int, handles: dict[str, str], report: EpochReport | None = None) -> None:
        """Produce ``epoch``'s dead letters and the marker in one transaction; nothing if the marker covers it."""
        if not handles:
            return
        from confluent_kafka import KafkaException

        records = [record for region in sorted(handles) for record in self.records_of(epoch, handles[region])]

        def produce(producer: Any) -> int:
            for key, value, headers in records:
                send(producer, self.topic, value, key, headers, -1, self.timeout_s)
            return len(records)

        try:
            sent = self.transaction.produce_once(epoch, self.topic, self._where(), produce, before=self._ensure_topic)
        except (KafkaException, BufferError) as exc:
            text = str(exc)
            raise KafkaDeadLetterError(
                f"{self._where()}: epoch {epoch}'s {len(records)} dead letter(s) could not be produced ({text}). The "
                "epoch is not recorded; the next start produces them, once." + (
                    " A dead letter is larger than the producer or topic takes: raise the topic's max.message.bytes "
                    "and deadLetter.kafka.message.max.bytes." if SIZE_TOO_LARGE in text else
                    " Check that the brokers are up and take this query's transactions")) from None
        if sent:
            log.info("regional: epoch %d: %d dead letter(s) produced to %s", epoch, len(records), self._where())

    def abort(self, epoch: int, handles: dict[str, str]) -> None:
        """Nothing: the handles hold the rows themselves, and nothing is staged outside the epoch's transaction."""

    def marked_epoch(self, consumer: Any) -> int | None:
        """The last epoch whose dead letters this query committed to the topic (the marker group's offset - 1)."""
        return self.transaction.marked_epoch(consumer, self.topic)

    def _ensure_topic(self) -> None:
        """Create the topic if it is missing (Kafka Connect creates its dead-letter topics too)."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({k: v for k, v in self._consumer_conf().items()
                             if k not in ("group.id", "enable.auto.commit", "isolation.level")})
        metadata = admin.list_topics(timeout=self.timeout_s)
        if self.topic in metadata.topics and metadata.topics[self.topic].error is None:
            return
        future = admin.create_topics([NewTopic(self.topic, self.partitions, self.replication)],
                                     operation_timeout=self.timeout_s)[self.topic]
        try:
            future.result(self.timeout_s)
            log.warning("regional: created the dead-letter topic %s", self._where())
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            raise KafkaDeadLetterError(
                f"{self._where()} does not exist and could not be created ({exc}): create it, or let this "
                "principal create topics") from None

    def records_of(self, epoch: int, handle: str) -> list[tuple[bytes | None, bytes | None, Headers]]:
        """One region's dead letters as Kafka records: (key, value, headers)."""
        table = decode_records(base64.b64decode(handle))
        names = table.schema.names
        source_columns = [n for n in names if n not in ("epoch", "error", "headers")]
        kafka_like = "value" in names and pa.types.is_binary(table.schema.field("value").type)
        schema = base64.b64encode(pa.schema([f for f in table.schema if f.name not in ("epoch", "error")])
                                  .serialize().to_pybytes())  # text, as every header here
        out = []
        for row in table.to_pylist():
            error = str(row.get("error") or "")
            cls, _, message = error.partition(": ")
            headers: Headers = [(str(h["key"]), h["value"]) for h in row.get("headers") or []]  # as they were
            headers += [(HEADER + "error.class", cls.encode()), (HEADER + "error.message", _capped(message)),
                        (HEADER + "region", str(row["region"]).encode()),
                        (HEADER + "offset", str(row["offset"]).encode()),
                        (HEADER + "epoch", str(row.get("epoch", epoch)).encode()),
                        (HEADER + "query.id", self.query_id.encode())]
            if row.get("topic") is not None and row.get("partition") is not None:
                headers += [(HEADER + "source.topic", str(row["topic"]).encode()),
                            (HEADER + "source.partition", str(row["partition"]).encode()),
                            (HEADER + "source.offset", str(row["offset"]).encode())]
            # What a replay (``source=deadLetters``, ``topic``) needs to give back the row as the source read it:
            # its columns' types, and the columns the record itself does not carry.
            headers.append((HEADER + "schema", schema))
            if kafka_like:
                key = row.get("key") if "key" in names else None
                rest = {n: row[n] for n in source_columns if n not in ("key", "value")}
                own = row.get("headers") if "headers" in names else []  # null (no headers at all) stays null
                headers += [(HEADER + "row", _json(rest)),
                            (HEADER + "source.headers", b"null" if own is None else str(len(own)).encode())]
                out.append((key, row["value"], headers))
            else:
                out.append((None, _json({n: row[n] for n in source_columns}), headers))
        return out


MAX_ERROR_MESSAGE_BYTES = 8192  # the error message often quotes the record: kept whole, a dead letter would double


def _capped(message: str) -> bytes:
    data = message.encode()
    if len(data) <= MAX_ERROR_MESSAGE_BYTES:
        return data
    return data[:MAX_ERROR_MESSAGE_BYTES].decode(errors="ignore").encode() + b" ... (cut)"


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity (strict parsers refuse the bare tokens): they become the text "NaN",
    "Infinity", "-Infinity", as Jackson writes them, at any depth (a replay reads them back)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json(row: dict[str, Any]) -> bytes:
    return json.dumps(_finite(row), default=_json_value, allow_nan=False).encode()


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    return str(value)
