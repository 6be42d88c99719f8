"""``source=kafka``: one region per topic-partition, with Spark's Kafka source options and row types.

Options, as Spark's Kafka source names them: ``kafka.bootstrap.servers``; exactly one of ``subscribe``
(comma list), ``subscribePattern`` (a Java-style regex matching whole topic names) and ``assign``
(JSON ``{"topic": [0, 1]}``); ``startingOffsets`` (``earliest``, ``latest`` or JSON per partition, -2
earliest, -1 latest; only for a new query); ``failOnDataLoss``; ``maxOffsetsPerTrigger``;
``includeHeaders``; ``kafkaConsumer.pollTimeoutMs``; every other ``kafka.*`` option goes to the
consumer (librdkafka's names, e.g. ``kafka.isolation.level``, ``kafka.security.protocol``). Like
Spark's, the consumer reads ``read_uncommitted`` unless ``kafka.isolation.level`` says otherwise.
Regional's own: ``commitOffsetsToGroup`` (after each recorded epoch, every region's committed offset
is committed to that consumer group, so Kafka's lag tools show regional progress) and
``metadataTimeoutMs`` (how long the driver waits for the broker, default 30 s).

Region id ``<topic>-<partition>``. A region's offset is the Kafka offset: not contiguous
(transaction markers, compaction), so a committed offset is "the next Kafka offset to read".
Partitions that appear later join at the next epoch from their earliest offset. A topic deleted and created
again is seen by its topic id (kept per epoch in the store, ``sources/kafka``) and follows ``failOnDataLoss``;
a partition the options no longer select (the subscription changed) is no longer read (``selects``).
"""

from __future__ import annotations

import atexit
import bisect
import json
import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from regional.errors import RegionalConfigError, RegionalDataLossError, RegionalError, RegionalStoreError
from regional.inputs.base import BATCH_ROWS, AcknowledgingInput, RegionInput, RetainedInput, StoredInput
from regional.protocol.settings import parse_bool, parse_int
from regional.store.model import EpochRecord
from regional.switches import switched_on

if TYPE_CHECKING:
    from regional.store import Store
    from regional.store.source_log import SourceLog

log = logging.getLogger("regional.kafka")
# librdkafka's own log lines (reconnects, retries): quiet unless a user turns this logger up. Failures that
# matter reach regional as errors, each with its own message.
client_log = logging.getLogger("regional.kafka.client")
if client_log.level == logging.NOTSET:
    client_log.setLevel(logging.CRITICAL)

SCHEMA = pa.schema([
    ("region", pa.string()), ("offset", pa.int64()), ("key", pa.binary()), ("value", pa.binary()),
    ("topic", pa.string()), ("partition", pa.int32()), ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestampType", pa.int32()),
])
SCHEMA_DDL = ("region STRING, offset BIGINT, key BINARY, value BINARY, topic STRING, partition INT, "
              "timestamp TIMESTAMP, timestampType INT")
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

EARLIEST, LATEST = -2, -1
# Options Spark's Kafka source refuses, and what to use instead.
REFUSED = {
    "kafka.auto.offset.reset": "startingOffsets",
    "kafka.enable.auto.commit": "commitOffsetsToGroup",
    "kafka.key.deserializer": "a cast or UDF on the binary key column",
    "kafka.value.deserializer": "a cast or UDF on the binary value column",
    "kafka.interceptor.classes": "nothing (Java consumer interceptors do not exist here)",
}
INTERNAL_TOPIC = re.compile(r"^__")
FETCH_WAIT_MS = "10"  # fetch.wait.max.ms of the tasks' consumers, unless kafka.fetch.wait.max.ms says otherwise
STALE_CONSUMER_S = 5.0  # a pooled consumer silent this long within a read is replaced by a new one, once


class KafkaError(RegionalError):
    """The broker did not answer, or answered with an error regional cannot read past."""


def create(options: dict[str, str]) -> KafkaInput:
    return KafkaInput(options)


@dataclass(frozen=True)
class PartitionSplit:
    topic: str
    partition: int


def region_of(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


class KafkaInput(RegionInput[PartitionSplit], RetainedInput, StoredInput, AcknowledgingInput):
    schema_ddl: str
    schema: pa.Schema

    def __init__(self, options: Mapping[str, str]) -> None:
        try:
            import confluent_kafka  # noqa: F401 - the client every part of this source uses
        except ImportError:
            raise RegionalConfigError("source=kafka needs confluent-kafka: pip install 'regional[kafka]'") from None
        opts = {k.lower(): str(v) for k, v in options.items()}
        self.bootstrap = opts.get("kafka.bootstrap.servers", "")
        if not self.bootstrap:
            raise RegionalConfigError("source=kafka needs the brokers: add .option('kafka.bootstrap.servers', "
                                      "'host:9092')")
        chosen = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
        if len(chosen) != 1:
            raise RegionalConfigError(
                "source=kafka needs exactly one of 'subscribe', 'subscribePattern' and 'assign'"
                + (f"; got {', '.join(chosen)}" if chosen else ""))
        self.subscribe: list[str] | None = None
        self.pattern: re.Pattern[str] | None = None
        self.assign: dict[str, list[int]] | None = None
        if opts.get("subscribe"):
            self.subscribe = [t.strip() for t in opts["subscribe"].split(",") if t.strip()]
            if not self.subscribe:
                raise RegionalConfigError("source=kafka: 'subscribe' names no topic; give a comma list of topics")
        elif opts.get("subscribepattern"):
            try:
                self.pattern = re.compile(opts["subscribepattern"])
            except re.error as exc:
                raise RegionalConfigError(f"source=kafka: subscribePattern {opts['subscribepattern']!r} is not a "
                                          f"valid regular expression: {exc}") from None
        else:
            self.assign = _parse_assign(opts["assign"])
        self.starting = _parse_starting_offsets(opts.get("startingoffsets", "latest"))
        for key, instead in REFUSED.items():
            if key in opts:
                raise RegionalConfigError(f"source=kafka does not take {key!r}: use {instead}")
        self.fail_on_data_loss = parse_bool(opts, "failOnDataLoss", default="true")
        self.include_headers = parse_bool(opts, "includeHeaders", default="false")
        self.poll_timeout_s = parse_int(opts, "kafkaConsumer.pollTimeoutMs", minimum=1, default="120000") / 1000
        self.metadata_timeout_s = parse_int(opts, "metadataTimeoutMs", minimum=1, default="30000") / 1000
        self.commit_group = opts.get("commitoffsetstogroup") or None
        self.consumer_conf: dict[str, str] = {k[len("kafka."):]: v for k, v in opts.items()
                                              if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
        self.consumer_conf.setdefault("isolation.level", "read_uncommitted")  # Spark's (Java's) default
        # A task reads one partition's range start to end: bigger fetches than librdkafka's 1 MB per partition
        # (measured: consume() time down by about a third for 200-byte records).
        self.consumer_conf.setdefault("max.partition.fetch.bytes", str(16 << 20))
        self.consumer_conf.setdefault("fetch.max.bytes", str(64 << 20))
        if self.consumer_conf["isolation.level"] not in ("read_committed", "read_uncommitted"):
            raise RegionalConfigError(f"source=kafka: kafka.isolation.level must be read_committed or "
                                      f"read_uncommitted, not {self.consumer_conf['isolation.level']!r}")
        self.schema = SCHEMA.append(pa.field("headers", HEADERS)) if self.include_headers else SCHEMA
        self.schema_ddl = SCHEMA_DDL + (", headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
                                        if self.include_headers else "")
        self._admin: Any = None
        self._splits: dict[str, PartitionSplit] = {}
        self._log_starts: dict[str, int] = {}
        self._store: Store | None = None
        self._ids_log: SourceLog | None = None
        self._id_history: list[tuple[int, dict[str, str]]] | None = None  # (from epoch, topic -> id), oldest first
        self._replaced: set[str] = set()
        self._check_client_conf()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_admin=None, _store=None, _ids_log=None, _id_history=None)  # tasks read, never plan
        return state

    def use_store(self, store: Store) -> None:
        self._store, self._ids_log, self._id_history = store, store.source_log("kafka"), None

    # -- the driver --------------------------------------------------------------------------------

    def _conf(self, **extra: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, **self.consumer_conf, "logger": client_log, **extra}

    def _check_client_conf(self) -> None:
        """A kafka.* option librdkafka does not know fails here, at start, naming it."""
        from confluent_kafka import KafkaException

        try:
            self.admin()
        except (KafkaException, ValueError, TypeError) as exc:
            raise RegionalConfigError(f"source=kafka: a kafka.* option is not a consumer setting: {exc}") from None

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient({k: v for k, v in self._conf().items() if k != "isolation.level"})
        return self._admin

    def partitions(self) -> dict[str, PartitionSplit]:
        """The topic-partitions this query reads now, by region id. Metadata the broker cannot give yet (a
        leader being elected after a restart) is asked for again, up to ``metadataTimeoutMs``."""
        from confluent_kafka import KafkaError as RdKafkaError

        deadline = time.monotonic() + self.metadata_timeout_s
        while True:
            try:
                metadata = self.admin().list_topics(timeout=max(deadline - time.monotonic(), 1.0))
            except Exception as exc:
                raise KafkaError(f"source=kafka: no answer from kafka.bootstrap.servers={self.bootstrap} within "
                                 f"{self.metadata_timeout_s:.0f} s ({exc}); check the address and that the brokers "
                                 "are up (metadataTimeoutMs sets the wait)") from None
            unsettled = [name for name, t in metadata.topics.items()
                         if (t.error is not None and t.error.code() != RdKafkaError.UNKNOWN_TOPIC_OR_PART)
                         or any(p.error is not None or p.leader < 0 for p in t.partitions.values())]
            if not unsettled or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        topics = {name: t for name, t in metadata.topics.items() if t.error is None}
        if self.subscribe is not None:
            wanted = {t: sorted(topics[t].partitions) for t in self.subscribe if t in topics}
        elif self.pattern is not None:
            wanted = {t: sorted(m.partitions) for t, m in topics.items()
                      if not INTERNAL_TOPIC.match(t) and self.pattern.fullmatch(t)}
        else:
            assert self.assign is not None
            wanted = {t: [p for p in ps if p in topics[t].partitions] for t, ps in self.assign.items() if t in topics}
        found = {region_of(topic, p): PartitionSplit(topic, p) for topic, parts in wanted.items() for p in parts}
        self._splits.update(found)
        return found

    def _describe(self) -> str:
        if self.subscribe is not None:
            return f"subscribe {','.join(self.subscribe)}"
        if self.pattern is not None:
            return f"subscribePattern {self.pattern.pattern!r}"
        return f"assign {json.dumps(self.assign)}"

    def _offsets(self, splits: Mapping[str, PartitionSplit], latest: bool) -> dict[str, int]:
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        if not splits:
            return {}
        spec = OffsetSpec.latest() if latest else OffsetSpec.earliest()
        level = (IsolationLevel.READ_COMMITTED if self.consumer_conf["isolation.level"] == "read_committed"
                 else IsolationLevel.READ_UNCOMMITTED)
        asked = {region: TopicPartition(s.topic, s.partition) for region, s in splits.items()}
        result: dict[str, int] = {}
        deadline = time.monotonic() + self.metadata_timeout_s
        while True:  # after a broker restart, leaders and their epochs settle within moments: ask again
            todo = {r: tp for r, tp in asked.items() if r not in result}
            if not todo:
                return result
            futures = self.admin().list_offsets({tp: spec for tp in todo.values()}, isolation_level=level,
                                                request_timeout=max(deadline - time.monotonic(), 1.0))
            by_partition = {(k.topic, k.partition): f for k, f in futures.items()}
            errors = {}
            for region, tp in todo.items():
                future = by_partition[(tp.topic, tp.partition)]
                try:
                    result[region] = int(future.result().offset)
                except Exception as failure:  # librdkafka's KafkaException, with the cause
                    errors[region] = failure
            if not errors:
                return result
            if time.monotonic() > deadline:
                region, first = next(iter(sorted(errors.items())))
                raise KafkaError(f"source=kafka: could not list the {'latest' if latest else 'earliest'} offset of "
                                 f"region {region!r} within {self.metadata_timeout_s:.0f} s ({first})")
            self._admin = None  # a fresh client: librdkafka's cached leader epochs can stay stale (measured)
            time.sleep(0.5)
            # A partition whose topic was deleted while we asked is gone, not slow: the plan's failOnDataLoss
            # check decides what that means, so stop asking for it.
            present = self.partitions()
            asked = {r: tp for r, tp in asked.items() if r in present}
            result = {r: o for r, o in result.items() if r in present}

    def ends(self) -> None:
        return None  # a topic may grow for ever

    def available(self, epoch: int) -> dict[str, int]:
        """Each partition's end: the high watermark (read_uncommitted) or last stable offset (read_committed).
        Also refreshes the log-start offsets (``log_starts``) of the same partitions."""
        splits = self.partitions()
        if not splits and epoch <= 0:
            raise RegionalConfigError(f"source=kafka: {self._describe()} matched no partition on {self.bootstrap}; "
                                      "create the topic(s) first, or fix the option")
        if self.assign is not None and epoch <= 0:
            missing = [f"{t}-{p}" for t, ps in self.assign.items() for p in ps if region_of(t, p) not in splits]
            if missing:
                raise RegionalConfigError(f"source=kafka: assign names partitions that do not exist: "
                                          f"{', '.join(missing[:10])}")
        self._replaced = self._check_topic_ids(epoch, splits)
        log_starts = self._offsets(splits, latest=False)
        ends = self._offsets({r: s for r, s in splits.items() if r in log_starts}, latest=True)
        self._log_starts = {r: o for r, o in log_starts.items() if r in ends}
        return ends

    def replaced(self) -> set[str]:
        return set(self._replaced)

    def selects(self, region: str) -> bool:
        topic, _, partition = region.rpartition("-")
        if self.subscribe is not None:
            return topic in self.subscribe
        if self.pattern is not None:
            return self.pattern.fullmatch(topic) is not None
        assert self.assign is not None
        return partition.isdigit() and int(partition) in self.assign.get(topic, [])

    # -- topic ids: a topic deleted and created again -------------------------------------------------------

    def _check_topic_ids(self, epoch: int, splits: Mapping[str, PartitionSplit]) -> set[str]:
        """Regions whose topic was created again since their committed offset was read (its topic id changed).
        The ids in force from each epoch on are kept in the store (``sources/kafka``), written before the plan
        that uses them is logged; a region's offset belongs to the ids of the epoch that last moved it, so a
        region that falls back after a re-creation is seen again at the next plan, and one that committed in
        the new topic is not. failOnDataLoss=true fails the query naming the topic."""
        if self._store is None or self._ids_log is None:
            return set()
        now = self._topic_ids(sorted({s.topic for s in splits.values()}))
        history = self._history()
        replaced: dict[str, tuple[str, str]] = {}  # region -> (old id, new id)
        for region, state in self._store.region_states().items():
            split = splits.get(region)
            if split is None or split.topic not in now:
                continue
            then = _ids_at(history, state.last_epoch, split.topic)
            if then is not None and then != now[split.topic]:
                replaced[region] = (then, now[split.topic])
        if replaced and self.fail_on_data_loss:
            topics = sorted({(splits[r].topic, old, new) for r, (old, new) in replaced.items()})
            raise RegionalDataLossError(
                "source=kafka: " + "; ".join(f"topic {t!r} was deleted and created again (topic id {old} when its "
                                              f"offsets were read, {new} now)" for t, old, new in topics[:5])
                + ": the committed offsets name records of the old topic. With failOnDataLoss=true (the default) "
                "the query stops. Set failOnDataLoss=false to read the new topic from its start (the loss is "
                "recorded in the epoch record), or start the query on a new checkpointLocation")
        latest = dict(history[-1][1]) if history else {}
        if any(latest.get(t) != i for t, i in now.items()):
            latest.update(now)
            entry = (epoch, latest)
            if self._ids_log.seq < 0 or self._ids_log.wants_snapshot():
                self._ids_log.write_snapshot({"history": [[e, ids] for e, ids in [*history, entry]]})
            else:
                self._ids_log.append([epoch, latest])
            history.append(entry)
        return set(replaced)

    def _history(self) -> list[tuple[int, dict[str, str]]]:
        if self._id_history is None:
            assert self._ids_log is not None
            loaded = self._ids_log.load()
            history: list[tuple[int, dict[str, str]]] = []
            if loaded is not None:
                snapshot, deltas = loaded
                try:
                    history = [(int(e), {str(t): str(i) for t, i in ids.items()})
                               for e, ids in [*snapshot["history"], *deltas]]
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    raise RegionalStoreError(
                        f"the regional store's topic ids {self._ids_log.directory} are unreadable "
                        f"({type(exc).__name__}: {exc}): restore them, or start the query on a new "
                        "checkpointLocation") from None
            self._id_history = history
        return self._id_history

    def _topic_ids(self, topics: list[str]) -> dict[str, str]:
        """Each topic's id (a topic created again gets a new one); topics that vanished meanwhile are left out."""
        from confluent_kafka import TopicCollection

        if not topics:
            return {}
        futures = self.admin().describe_topics(TopicCollection(topics), request_timeout=self.metadata_timeout_s)
        ids = {}
        for topic, future in futures.items():
            try:
                ids[topic] = str(future.result().topic_id)
            except Exception as exc:  # deleted since the listing: the plan's gone-region check decides
                log.debug("regional: no topic id for %r: %s", topic, exc)
        return ids

    def log_starts(self) -> dict[str, int]:
        """Each partition's log-start offset as of the last ``available``: older records are gone (retention)."""
        return dict(self._log_starts)

    def starting_offsets(self, available: Mapping[str, int]) -> dict[str, int]:
        """Where the partitions present when a new query starts begin (``startingOffsets``)."""
        starts = self.log_starts()
        if self.starting in ("earliest", "latest"):
            chosen = starts if self.starting == "earliest" else available
            return {r: chosen[r] for r in available}
        assert isinstance(self.starting, dict)
        named = {region_of(t, p): o for t, ps in self.starting.items() for p, o in ps.items()}
        unknown = sorted(set(named) - set(available))
        if unknown:
            raise RegionalConfigError(f"source=kafka: startingOffsets names partitions this query does not read: "
                                      f"{', '.join(unknown[:10])}")
        unnamed = sorted(set(available) - set(named))
        if unnamed:
            raise RegionalConfigError(
                f"source=kafka: startingOffsets gives specific offsets but not for {', '.join(unnamed[:10])}; as with "
                "Spark's Kafka source, name every partition (-2 for earliest, -1 for latest)")
        result = {}
        for region, offset in named.items():
            if offset == EARLIEST:
                result[region] = starts[region]
            elif offset == LATEST:
                result[region] = available[region]
            elif offset > available[region]:
                raise RegionalConfigError(f"source=kafka: startingOffsets gives {region} offset {offset}, past its "
                                          f"end {available[region]}")
            else:
                result[region] = offset  # below the log start: the plan's failOnDataLoss check decides
        return result

    def split(self, region: str, start: int, end: int) -> PartitionSplit:
        split = self._splits.get(region)
        if split is None:  # a restarted driver re-runs its last planned epoch before it lists the partitions
            split = self.partitions().get(region) or self._existing_partition(region)
        if split is None:
            raise KafkaError(f"source=kafka: region {region!r} of a planned epoch is not a partition on the brokers "
                             "now (was its topic deleted?); its records of that epoch cannot be read")
        return split

    def _existing_partition(self, region: str) -> PartitionSplit | None:
        """A partition the options no longer select (the subscription changed between restarts) that a plan
        logged before the change still reads: that epoch is re-run as planned; the next plan decides on it."""
        topic, _, partition = region.rpartition("-")
        if not partition.isdigit():
            return None
        metadata = self.admin().list_topics(timeout=self.metadata_timeout_s)  # all topics: never auto-creates one
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or int(partition) not in found.partitions:
            return None
        split = self._splits[region] = PartitionSplit(topic, int(partition))
        return split

    def on_recorded(self, record: EpochRecord) -> None:
        """commitOffsetsToGroup: every known region's committed offset goes to the consumer group."""
        if not self.commit_group:
            return
        from confluent_kafka import Consumer, TopicPartition

        offsets = [TopicPartition(s.topic, s.partition, state.committed_offset)
                   for region, state in sorted(record.regions.items()) if (s := self._splits.get(region))]
        if not offsets:
            return
        consumer = Consumer(self._conf(**{"group.id": self.commit_group, "enable.auto.commit": False}))
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:
            log.warning("regional: could not commit epoch %d's offsets to consumer group %r: %s", record.epoch,
                        self.commit_group, exc)
        finally:
            consumer.close()

    # -- the task ----------------------------------------------------------------------------------

    def read(self, region: str, start: int, end: int, split: Any,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """Offsets ``[start, end)`` of one partition, stopping exactly at ``end``. Gaps (transaction markers,
        aborted or compacted records) are skipped; the end of the partition's readable log also ends the read,
        so a marker at ``end - 1`` is never waited for."""
        from confluent_kafka import KafkaError as RdKafkaError
        from confluent_kafka import TopicPartition

        assert isinstance(split, PartitionSplit)
        conf = self._conf(**{
            "group.id": self.consumer_conf.get("group.id", "regional-reader"), "enable.auto.commit": False,
            "enable.partition.eof": True, "auto.offset.reset": "error",
            # A consumer that reached the log's end has a fetch waiting at the broker for this long, and a pooled
            # consumer's next range waited for it (500 ms by default; measured). A task reads records that exist.
            "fetch.wait.max.ms": self.consumer_conf.get("fetch.wait.max.ms", FETCH_WAIT_MS)})
        consumer, reused = CONSUMERS.take(conf)
        finished = False
        try:
            consumer.assign([TopicPartition(split.topic, split.partition, start)])
            rows = _Rows(region, split, self.include_headers)
            deadline = time.monotonic() + self.poll_timeout_s
            silent_since: float | None = None
            done = start >= end
            while not done:
                # librdkafka's consume() returns when it has num_messages or at the timeout: ask for no more than
                # the range can still hold, or every task waits out the timeout at its range's end (0.5 s each).
                left = end - (start if rows.next_offset is None else rows.next_offset)
                messages = consumer.consume(num_messages=max(min(batch_rows - len(rows), left), 1), timeout=0.2)
                if messages:
                    deadline = time.monotonic() + self.poll_timeout_s
                    silent_since = None
                elif reused:
                    silent_since = silent_since or time.monotonic()
                    if time.monotonic() - silent_since > STALE_CONSUMER_S:
                        # A pooled client may hold stale metadata (a topic deleted and created again after broker
                        # restarts: librdkafka ignores the new topic's lower leader epoch; measured). Go on from
                        # the next offset with a new consumer, once.
                        stale, consumer = consumer, None
                        stale.close()
                        consumer, reused = CONSUMERS.take(conf, fresh=True)
                        consumer.assign([TopicPartition(split.topic, split.partition,
                                                        start if rows.next_offset is None else rows.next_offset)])
                        continue
                records = [m for m in messages if m.error() is None]
                if len(records) != len(messages):  # errors, or the end of the readable log
                    for m in messages:
                        error = m.error()
                        if error is None:
                            continue
                        if error.code() == RdKafkaError._PARTITION_EOF:
                            # an end-of-log marker with no offset, or of another partition, ends nothing
                            done = done or ((m.offset() or 0) >= end and _of(m, split))
                        elif error.code() == RdKafkaError._AUTO_OFFSET_RESET or "out of range" in str(error).lower():
                            raise KafkaError(f"region {region!r}: offsets from {start} are no longer in the log "
                                             f"(deleted by retention?): {error}")
                        elif not error.retriable():
                            raise KafkaError(f"region {region!r}: reading [{start}, {end}) failed: {error}")
                if records:
                    offsets = [_offset_of(m, region) for m in records]
                    expected = start if rows.next_offset is None else rows.next_offset
                    if offsets[0] < expected or not _of(records[0], split):
                        # Not this range's: left from a pooled consumer's earlier assignment (librdkafka drops
                        # those itself; this guards against duplicates and other partitions' records). The
                        # queue is in order, so a lot whose first record is this range's holds nothing older.
                        kept = [(m, o) for m, o in zip(records, offsets, strict=True)
                                if o >= expected and _of(m, split)]
                        records, offsets = [m for m, _ in kept], [o for _, o in kept]
                if records:
                    if offsets[-1] >= end - 1:  # the range ends in this lot: keep what is below end
                        cut = bisect.bisect_left(offsets, end)
                        records, offsets, done = records[:cut], offsets[:cut], True
                    rows.add(records, offsets)
                if len(rows) >= batch_rows or (done and len(rows)):
                    yield rows.batch(self.schema)
                if not done and time.monotonic() > deadline:
                    raise KafkaError(
                        f"region {region!r}: no record of [{start}, {end}) arrived for {self.poll_timeout_s:.0f} s "
                        f"(read up to {rows.next_offset}); is the broker up? kafkaConsumer.pollTimeoutMs sets the wait")
            finished = True
        finally:
            CONSUMERS.give_back(conf, consumer, reusable=finished)


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

    def __init__(self, region: str, split: PartitionSplit, headers: bool) -> None:
        self.region, self.split, self.with_headers = region, split, headers
        self.next_offset: int | None = None
        self._clear()

    def _clear(self) -> None:
        self.offsets: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.stamps: list[tuple[int, int]] = []
        self.headers: list[Any] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, records: list[Any], offsets: list[int]) -> None:
        if not records:
            return
        self.offsets += offsets
        self.keys += [m.key() for m in records]
        self.values += [m.value() for m in records]
        self.stamps += [m.timestamp() for m in records]
        if self.with_headers:
            self.headers += [[{"key": k, "value": v} for k, v in h] if (h := m.headers()) else None for m in records]
        self.next_offset = offsets[-1] + 1

    def batch(self, schema: pa.Schema) -> pa.RecordBatch:
        n = len(self.offsets)
        kinds = pa.array([k for k, _ in self.stamps], pa.int32())
        millis = pa.array([ms for _, ms in self.stamps], pa.int64())
        # librdkafka's kinds 0/1/2 are Java's -1 (none), 0 (CreateTime), 1 (LogAppendTime)
        stamps = pc.if_else(pc.equal(kinds, 0), None, pc.multiply(millis, 1000)).cast(pa.timestamp("us", tz="UTC"))
        columns = [
            _constant(self.region, pa.string(), n), pa.array(self.offsets, pa.int64()),
            pa.array(self.keys, pa.binary()), pa.array(self.values, pa.binary()),
            _constant(self.split.topic, pa.string(), n), _constant(self.split.partition, pa.int32(), n),
            stamps, pc.subtract(kinds, 1),
        ]
        if self.with_headers:
            columns.append(pa.array(self.headers, HEADERS))
        self._clear()
        return pa.RecordBatch.from_arrays(columns, schema=schema)


def _constant(value: Any, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` copies of one value, built in Arrow rather than from a Python list."""
    return pc.fill_null(pa.nulls(n, type_), pa.scalar(value, type_))


def _ids_at(history: list[tuple[int, dict[str, str]]], epoch: int | None, topic: str) -> str | None:
    """The id ``topic`` had for offsets read in ``epoch`` (None: before any epoch moved them, so the first id known)."""
    found = None
    for since, ids in history:
        if epoch is not None and since > epoch:
            break
        if topic in ids:
            found = ids[topic]
            if epoch is None:
                break
    return found


def _parse_assign(text: str) -> dict[str, list[int]]:
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not data or not all(isinstance(ps, list) and ps for ps in data.values()):
            raise ValueError("expected a JSON object of topic -> non-empty list of partitions")
        return {str(t): sorted({int(p) for p in ps}) for t, ps in data.items()}
    except (ValueError, TypeError) as exc:
        raise RegionalConfigError(f"source=kafka: assign {text!r} is not valid: {exc}; write it as "
                                  '{"topicA": [0, 1], "topicB": [2]}') from None


def _parse_starting_offsets(text: str) -> str | dict[str, dict[int, int]]:
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return word
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not data:
            raise ValueError("expected a JSON object")
        parsed: dict[str, dict[int, int]] = {}
        for topic, parts in data.items():
            if not isinstance(parts, dict):
                raise ValueError(f"topic {topic!r} maps to {parts!r}, not to an object of partition -> offset")
            parsed[str(topic)] = {int(p): int(o) for p, o in parts.items()}
            if any(o < EARLIEST for o in parsed[str(topic)].values()):
                raise ValueError("offsets are >= 0, or -2 (earliest) or -1 (latest)")
        return parsed
    except (ValueError, TypeError) as exc:
        raise RegionalConfigError(
            f"source=kafka: startingOffsets {text!r} is not 'earliest', 'latest' or JSON such as "
            f'{{"topicA": {{"0": 23, "1": -2}}}} ({exc})') from None


def _of(message: Any, split: PartitionSplit) -> bool:
    return bool(message.partition() == split.partition and message.topic() == split.topic)


def _offset_of(message: Any, region: str) -> int:
    """A fetched record's offset; librdkafka gives every record without an error one."""
    offset = message.offset()
    if offset is None:
        raise KafkaError(f"region {region!r}: librdkafka returned a record without an offset")
    return int(offset)
