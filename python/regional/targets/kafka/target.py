"""``target=kafka``: the two-phase committer (the package's docstring says how it works).

In each region's task: ``prepare`` (check the rows against the topics' metadata, stage them as one Arrow file).
On the driver: ``open`` (the columns, the producer's settings), ``commit`` (produce the published regions' staged
rows and the marker in one transaction), ``abort`` and ``sweep`` (remove staged files).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from regional.errors import RegionalConfigError, RegionalError, RegionalStoreError
from regional.ids import encode_region
from regional.storage import Storage, open_storage
from regional.targets.base import EpochReport, RowsInvalid, Target, require_query_id
from regional.targets.kafka.records import (
    STAGED,
    TopicFacts,
    check_columns,
    illegal_topic,
    refusal,
    staged_batch,
)
from regional.targets.kafka.settings import (
    KafkaTargetSettings,
    check_producer,
    parse_settings,
    producer_settings,
)
from regional.targets.kafka.transaction import EpochTransaction, client_log, failure_hint, send

log = logging.getLogger("regional.kafka")

DEFAULT_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's message.max.bytes
DEFAULT_BATCH_SIZE = 1_000_000  # librdkafka's batch.size
DEFAULT_TOPIC_MAX_BYTES = 1_048_588  # a broker's message.max.bytes, a topic's max.message.bytes by default
JAVA_PARTITIONER = "murmur2_random"  # Java's default partitioner on a key (Spark's sink), in librdkafka


class KafkaTargetError(RegionalError):
    """The brokers did not take an epoch's records: the epoch is not recorded, and the next start produces them
    (once)."""


def transactional_id(query_id: str) -> str:
    return f"regional-{query_id}-kafka"


class KafkaTarget(Target[dict[str, Any] | None]):
    """Rows to Kafka topics, exactly once per region for ``read_committed`` consumers."""

    def __init__(self, options: dict[str, str]) -> None:
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            raise RegionalConfigError("target=kafka needs confluent-kafka: pip install "
                                      "'pyspark-regional[kafka]'") from None
        # The producer's settings are kept apart from self.options, which a Target shows: they may hold secrets.
        self._conf = producer_settings(options)
        super().__init__({k: v for k, v in options.items() if not k.startswith("kafka.")})
        self.settings: KafkaTargetSettings = parse_settings(options)
        self.query_id = require_query_id("kafka", options)
        self._conf["bootstrap.servers"] = self.settings.bootstrap
        self._conf.setdefault("partitioner", JAVA_PARTITIONER)
        self.transaction = EpochTransaction(transactional_id(self.query_id), self._conf, self.query_id,
                                            self.settings.timeout_s, failpoint="kafka")
        self._storage: Storage | None = None

    def __repr__(self) -> str:  # never the producer's settings
        return f"KafkaTarget(brokers={self.settings.bootstrap!r}, topic={self.settings.topic!r})"

    def _where(self) -> str:
        topic = f"topic={self.settings.topic} " if self.settings.topic else ""
        return f"target=kafka ({topic}kafka.bootstrap.servers={self.settings.bootstrap})"

    @property
    def storage(self) -> Storage:
        if self._storage is None:  # below the query's id: queries sharing a stagingLocation sweep only their own
            self._storage = open_storage(self.settings.staging.child(self.query_id))
        return self._storage

    # -- on the driver, before each epoch's tasks ----------------------------------------------------------

    def open(self, schema: pa.Schema) -> None:
        check_columns(schema, self.settings.topic)
        check_producer(self._conf)

    def location(self) -> str | None:
        return None

    # -- phase one, in a Spark task ------------------------------------------------------------------------

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> dict[str, Any] | None:
        """Check the region's rows and stage them as one Arrow file; None when it has no rows."""
        facts = _Metadata(self._conf, self.settings.timeout_s)
        name = f"{epoch}/{encode_region(region)}-{uuid.uuid4().hex[:12]}.arrow"
        writer = None
        sink = None
        rows, topics = 0, set[str]()
        try:
            for batch in batches:
                staged = staged_batch(batch, self.settings.topic)
                if staged.num_rows == 0:
                    continue
                topics.update(self._check(staged, facts))
                if writer is None:
                    sink = self.storage.open_writer(name)
                    writer = pa.ipc.new_stream(sink, STAGED)
                writer.write_batch(staged)
                rows += staged.num_rows
            if writer is None:
                return None
            writer.close()
            assert sink is not None
            sink.close()
        except BaseException:
            if sink is not None:
                self.storage.discard(sink)
            raise
        # The smallest max.message.bytes of its topics: the driver's producer batches no more than that per request
        # (librdkafka fills a batch up to batch.size, a topic refuses a batch larger than its max.message.bytes).
        return {"file": name, "rows": rows, "topics": sorted(topics),
                "maxBatchBytes": min(facts.topic(t).max_batch_bytes for t in topics)}

    def probe(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> None:
        """Whether Kafka would take these rows: checked, never staged."""
        facts = _Metadata(self._conf, self.settings.timeout_s)
        for batch in batches:
            staged = staged_batch(batch, self.settings.topic)
            if staged.num_rows:
                self._check(staged, facts)

    def _check(self, staged: pa.RecordBatch, facts: _Metadata) -> set[str]:
        """Raise the first row's refusal; else the batch's topics."""
        names = {t for t in staged.column("topic").unique().to_pylist() if t is not None}
        for name in sorted(names):  # before asking the brokers: a topic that can never exist is the row's fault
            why = illegal_topic(name)
            if why is not None:
                raise RowsInvalid(f"{why} (Spark's Kafka sink fails with InvalidTopicException): fix the row's "
                                  "topic column")
        refused = refusal(staged, {t: facts.topic(t) for t in names}, facts.message_max_bytes,
                          codec=self._codec())
        if refused is not None:
            raise refused
        return names

    # -- phase two, on the driver --------------------------------------------------------------------------

    def commit(self, epoch: int, handles: dict[str, dict[str, Any] | None],
               report: EpochReport | None = None) -> None:
        """Produce the handles' staged rows and the marker in one transaction; nothing if the marker covers it."""
        staged = {region: h for region, h in handles.items() if h}
        if not staged:
            return
        from confluent_kafka import KafkaException

        marker_topic = min(t for h in staged.values() for t in h["topics"])
        produced = 0

        def produce(producer: Any) -> int:
            nonlocal produced
            for region in sorted(staged):
                produced += self._produce_region(producer, epoch, region, staged[region])
            return produced

        try:
            sent = self.transaction.produce_once(epoch, marker_topic, self._where(), produce,
                                                 settings=self._batch_settings(staged))
        except (KafkaException, BufferError) as exc:
            text = str(exc)
            raise KafkaTargetError(
                f"{self._where()}: epoch {epoch}'s {sum(h['rows'] for h in staged.values()):,} record(s) could not "
                f"be produced ({text}). The epoch is not recorded; the next start produces them, once."
                + failure_hint(text)) from None
        if sent:
            log.info("regional: epoch %d: %d record(s) of %d region(s) produced to %s", epoch, produced,
                     len(staged), self._where())

    def _batch_settings(self, staged: dict[str, dict[str, Any]]) -> dict[str, str]:
        """``batch.size`` no larger than the epoch's topics take in one batch: records that each fit their topic
        alone are refused by the broker (MESSAGE_TOO_LARGE, the whole epoch) when librdkafka batches them past
        the topic's max.message.bytes. Compressed, a batch of incompressible records grows by the codec's framing:
        a margin is left for it."""
        limits = [int(h["maxBatchBytes"]) for h in staged.values() if h.get("maxBatchBytes")]
        if not limits:
            return {}
        limit = min(limits)
        if self._compressed():
            limit -= limit // 64 + 512
        given = int(self._conf.get("batch.size", DEFAULT_BATCH_SIZE))
        return {"batch.size": str(max(1, min(given, limit)))}

    def _compressed(self) -> bool:
        return self._codec() is not None

    def _codec(self) -> str | None:
        """The producer's codec (``compression.type``, or librdkafka's ``compression.codec``), None for none."""
        codec = str(self._conf.get("compression.type", self._conf.get("compression.codec", "none"))).strip().lower()
        return None if codec in ("none", "", "inherit") else codec

    def _produce_region(self, producer: Any, epoch: int, region: str, handle: dict[str, Any]) -> int:
        data = self.storage.read(handle["file"])
        if data is None:
            raise RegionalStoreError(
                f"epoch {epoch}: region {region!r}'s staged rows ({self.storage.describe(handle['file'])}) are "
                "missing: stagingLocation must be one place the executors and the driver both reach (a shared or "
                "object-store path), and nothing may remove it while the query runs. The epoch is not recorded")
        table = pa.ipc.open_stream(data).read_all()
        if table.num_rows != handle["rows"]:
            raise RegionalStoreError(f"epoch {epoch}: region {region!r}'s staged file holds {table.num_rows} rows "
                                     f"where its task staged {handle['rows']}: the staging area was changed")
        timeout = self.settings.timeout_s
        produce = producer.produce  # the loop is phase two's cost per record: nothing in it but producing
        for batch in table.to_batches():
            plain = batch.column("headers").null_count == batch.num_rows == batch.column("partition").null_count
            topics = batch.column("topic").unique()
            if plain and len(topics) == 1:  # the common rows: one topic, no headers, the partitioner's choice
                topic = topics[0].as_py()
                for value, key in zip(batch.column("value").to_pylist(), batch.column("key").to_pylist(),
                                      strict=True):
                    try:
                        produce(topic, value, key)
                    except BufferError:
                        send(producer, topic, value, key, None, -1, timeout)
                continue
            columns = [batch.column(n).to_pylist() for n in ("topic", "value", "key", "headers", "partition")]
            for topic, value, key, headers, partition in zip(*columns, strict=True):
                pairs = [(h["key"], h["value"]) for h in headers] if headers else None
                try:
                    produce(topic, value, key, -1 if partition is None else partition, headers=pairs)
                except BufferError:  # the queue is full: served, then taken
                    send(producer, topic, value, key, pairs, -1 if partition is None else partition, timeout)
        return table.num_rows

    def abort(self, epoch: int, handles: dict[str, dict[str, Any] | None]) -> None:
        """Remove staged files that will never be produced."""
        for handle in handles.values():
            if handle:
                self.storage.delete(handle["file"])

    def sweep(self, up_to_epoch: int) -> None:
        """Remove what recorded epochs staged: produced, or never to be (dead tasks and drivers leave files)."""
        epochs = {info.name.split("/", 1)[0] for info in self.storage.list("", recursive=True)}
        for epoch in sorted(e for e in epochs if e.isdigit() and int(e) <= up_to_epoch):
            self.storage.delete_tree(epoch)


# Per Python worker (Spark reuses workers across tasks): one metadata client per producer configuration, and each
# topic's max.message.bytes for LIMIT_TTL_S. Building the clients and describing the topic in every task cost about
# 0.3 s a task (benchmarks/kafka_target.py); the partitions are asked in every task still (a broker out of reach
# fails the task: an outage, the region falls back).
LIMIT_TTL_S = 30.0
TOPIC_CREATION_WAIT_S = 2.0  # brokers that create topics on first use answer the first request "unknown"
_CLIENTS: dict[tuple[tuple[str, str], ...], tuple[Any, Any]] = {}
_LIMITS: dict[tuple[tuple[tuple[str, str], ...], str], tuple[float, int]] = {}


class _Metadata:
    """In a task: the facts about the topics its rows go to, asked of the brokers once per topic. A broker that
    cannot be reached fails the task (the region falls back: an outage), never the rows."""

    def __init__(self, conf: dict[str, Any], timeout_s: float) -> None:
        self._conf, self._timeout = conf, timeout_s
        self._key = tuple(sorted((k, str(v)) for k, v in conf.items() if k != "transactional.id"))
        self._topics: dict[str, TopicFacts] = {}
        self.message_max_bytes = int(conf.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES))

    def topic(self, name: str) -> TopicFacts:
        if name not in self._topics:
            self._topics[name] = self._ask(name)
        return self._topics[name]

    def _clients(self) -> tuple[Any, Any]:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient

        if self._key not in _CLIENTS:  # a producer's metadata request creates the topic where the brokers allow it
            producer = Producer({k: v for k, v in self._conf.items() if k != "transactional.id"}
                                | {"logger": client_log})
            admin = AdminClient({k: v for k, v in self._conf.items()
                                 if k in ("bootstrap.servers",) or k.startswith(("security.", "sasl.", "ssl."))}
                                | {"logger": client_log})
            _CLIENTS[self._key] = (producer, admin)
        return _CLIENTS[self._key]

    def _ask(self, name: str) -> TopicFacts:
        import time

        from confluent_kafka import KafkaError, KafkaException

        producer, admin = self._clients()
        deadline = time.monotonic() + TOPIC_CREATION_WAIT_S
        while True:
            try:
                found = producer.list_topics(name, timeout=self._timeout).topics.get(name)
            except KafkaException as exc:
                raise KafkaTargetError(
                    f"target=kafka: the brokers ({self._conf.get('bootstrap.servers')}) did not answer about topic "
                    f"{name!r} within timeoutMs ({exc.args[0] if exc.args else exc}); the region falls back until "
                    "they do") from None
            code = found.error.code() if found is not None and found.error is not None else None
            if found is not None and code is None:
                break
            if code != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                why = ("is not authorized for this principal" if code == KafkaError.TOPIC_AUTHORIZATION_FAILED
                       else "does not exist (and the brokers did not create it on first use)")
                raise KafkaTargetError(f"target=kafka: topic {name!r} {why}: create it, or grant this principal "
                                       "access; the region falls back until then")
            time.sleep(0.2)
        return TopicFacts(len(found.partitions), self._limit(admin, name))

    def _limit(self, admin: Any, name: str) -> int:
        import time

        from confluent_kafka import KafkaException
        from confluent_kafka.admin import ConfigResource

        asked = _LIMITS.get((self._key, name))
        if asked is not None and time.monotonic() - asked[0] < LIMIT_TTL_S:
            return asked[1]
        try:
            [future] = admin.describe_configs([ConfigResource("topic", name)]).values()
            entry = future.result(self._timeout).get("max.message.bytes")
            max_bytes = int(entry.value) if entry is not None and entry.value else DEFAULT_TOPIC_MAX_BYTES
        except KafkaException:  # not allowed to describe: the brokers' default
            max_bytes = DEFAULT_TOPIC_MAX_BYTES
        _LIMITS[(self._key, name)] = (time.monotonic(), max_bytes)
        return max_bytes
