"""``source=kafka``: one region per topic-partition, with Spark's Kafka source's options, columns and row types.

The options are Spark's (``options.OPTIONS`` lists every option of Spark's Kafka source with regional's answer: honoured
with Spark's meaning, or refused at start), plus regional's ``commitOffsetsToGroup`` and ``metadataTimeoutMs``. The
columns are Spark's, in Spark's order (``key, value, topic, partition, offset, timestamp, timestampType[, headers]``),
then regional's ``region``. ``kafka.*`` options go to the consumer in librdkafka's names; like Spark's, it reads
``read_uncommitted`` unless ``kafka.isolation.level`` says otherwise.

Region id ``<topic>-<partition>``. A region's offset is the Kafka offset: not contiguous
(transaction markers, compaction), so a committed offset is "the next Kafka offset to read".
Partitions that appear later join at the next epoch from their earliest offset. A topic deleted and created
again is seen by its topic id (kept per epoch in the store, ``sources/kafka``) and follows ``failOnDataLoss``;
a partition the options no longer select (the subscription changed) is no longer read (``selects``).
"""

from __future__ import annotations

import bisect
import json
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from regional.errors import RegionalConfigError, RegionalDataLossError, RegionalStoreError
from regional.inputs.base import BATCH_BYTES, BATCH_ROWS, AcknowledgingInput, RegionInput, RetainedInput, StoredInput
from regional.inputs.kafka.client_settings import consumer_settings, ignored_by_consumer
from regional.inputs.kafka.java_regex import compile_java
from regional.inputs.kafka.options import EARLIEST, LATEST, OPTIONS, Starting, parse_assign, parse_starting
from regional.inputs.kafka.reading import (
    CONSUMERS,
    FETCH_WAIT_MS,
    HEADERS,
    SCHEMA,
    SCHEMA_DDL,
    SCHEMA_WITH_HEADERS,
    SCHEMA_WITH_HEADERS_DDL,
    STALE_CONSUMER_S,
    ConsumerPool,
    KafkaError,
    PartitionSplit,
    _of,
    _offsets_of,
    _Rows,
    client_log,
    log,
)
from regional.protocol.settings import parse_bool, parse_int, parse_optional_int
from regional.store.model import EpochRecord

if TYPE_CHECKING:
    from regional.store import Store
    from regional.store.source_log import SourceLog

__all__ = ["CONSUMERS", "EARLIEST", "FETCH_WAIT_MS", "HEADERS", "LATEST", "OPTIONS", "SCHEMA", "SCHEMA_WITH_HEADERS",
           "ConsumerPool", "KafkaError", "KafkaInput", "PartitionSplit", "client_log", "create", "region_of"]

# Kafka's internal topics all start with this (Topic.isInternal: __consumer_offsets, __transaction_state,
# __share_group_state); only such topics are asked whether they are internal, and only the broker's answer decides.
INTERNAL_PREFIX = "__"
KAFKA_INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


def create(options: dict[str, str]) -> KafkaInput:
    return KafkaInput(options)


def region_of(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


class KafkaInput(RegionInput[PartitionSplit], RetainedInput, StoredInput, AcknowledgingInput):
    schema_ddl: str
    schema: pa.Schema
    batch_bytes = BATCH_BYTES  # a task's batches hold at most this many bytes of keys, values and headers

    def __init__(self, options: Mapping[str, str]) -> None:
        try:
            import confluent_kafka  # noqa: F401 - the client every part of this source uses
        except ImportError:
            raise RegionalConfigError("source=kafka needs confluent-kafka: pip install "
                                      "'pyspark-regional[kafka]'") from None
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
        self.pattern_text = ""  # as given (Java's syntax); ``pattern`` is its translation
        self.assign: dict[str, list[int]] | None = None
        if opts.get("subscribe"):
            self.subscribe = [t.strip() for t in opts["subscribe"].split(",") if t.strip()]
            if not self.subscribe:
                raise RegionalConfigError("source=kafka: 'subscribe' names no topic; give a comma list of topics")
        elif opts.get("subscribepattern"):
            # Spark trims it, reads it as a Java regular expression and finds it anywhere in a topic's name (Scala's
            # findFirstIn over the admin client's listing, not the Java consumer's whole-name matches())
            self.pattern = compile_java(opts["subscribepattern"].strip())
            self.pattern_text = opts["subscribepattern"].strip()
        else:
            self.assign = parse_assign(opts["assign"])
        for key in sorted(options):  # as the reader's check, for an input built directly
            declared = OPTIONS.find(key)
            if declared is not None and declared.refused is not None:
                raise RegionalConfigError(f"source=kafka does not take {declared.name!r}: {declared.refused}")
        self.starting: Starting = parse_starting(opts)
        self.fail_on_data_loss = parse_bool(opts, "failOnDataLoss", default="true")
        self.include_headers = parse_bool(opts, "includeHeaders", default="false")
        self.poll_timeout_s = parse_int(opts, "kafkaConsumer.pollTimeoutMs", minimum=1, default="120000") / 1000
        self.metadata_timeout_s = parse_int(opts, "metadataTimeoutMs", minimum=1, default="30000") / 1000
        # Spark's driver asks for offsets again numRetries times, retryIntervalMs apart; without numRetries regional
        # asks again until metadataTimeoutMs (a broker restarting takes longer than Spark's 3 x 10 ms).
        self.offset_retries = parse_optional_int(opts, "fetchOffset.numRetries", minimum=0)
        self.retry_interval_s = parse_int(opts, "fetchOffset.retryIntervalMs", minimum=0, default="500") / 1000
        self.commit_group = opts.get("commitoffsetstogroup") or None
        # Every kafka.* option reaches the consumers (Java names librdkafka spells differently mapped) or is refused.
        self.consumer_conf: dict[str, str] = consumer_settings(opts)
        self.consumer_conf.setdefault("isolation.level", "read_uncommitted")  # Spark's (Java's) default
        # A task reads one partition's range start to end: bigger fetches than librdkafka's 1 MB per partition
        # (measured: consume() time down by about a third for 200-byte records).
        self.consumer_conf.setdefault("max.partition.fetch.bytes", str(16 << 20))
        self.consumer_conf.setdefault("fetch.max.bytes", str(64 << 20))
        if self.consumer_conf["isolation.level"] not in ("read_committed", "read_uncommitted"):
            raise RegionalConfigError(f"source=kafka: kafka.isolation.level must be read_committed or "
                                      f"read_uncommitted, not {self.consumer_conf['isolation.level']!r}")
        # The tasks' consumers never join their group nor commit; the id is what ACLs and quotas see.
        prefix = opts.get("groupidprefix", "").strip()
        self.reader_group = self.consumer_conf.get("group.id") or (
            f"{prefix}-{uuid.uuid4()}-executor" if prefix else "regional-reader")
        self.schema = SCHEMA_WITH_HEADERS if self.include_headers else SCHEMA
        self.schema_ddl = SCHEMA_WITH_HEADERS_DDL if self.include_headers else SCHEMA_DDL
        self._internal: dict[str, bool] = {}  # topic -> the broker says it is internal (asked once per name)
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
        """A kafka.* option librdkafka does not know, or would ignore in the tasks' consumers, fails here, at start,
        naming it."""
        from confluent_kafka import KafkaException

        try:
            self.admin()
            ignored = ignored_by_consumer({k: v for k, v in self._read_conf().items() if k != "logger"})
        except (KafkaException, ValueError, TypeError) as exc:
            raise RegionalConfigError(
                f"source=kafka: a kafka.* option is not a consumer setting librdkafka knows (the Kafka client regional "
                f"reads with): {exc} (Spark's Java client spells some settings differently: see regional's "
                "docs/sources/kafka.md)") from None
        if ignored:  # librdkafka names the property, not the alias the user may have given: find the option
            base = {k: v for k, v in self._read_conf().items() if k != "logger" and k not in self.consumer_conf}
            given = [k for k, v in self.consumer_conf.items() if ignored_by_consumer({**base, k: v})]
            raise RegionalConfigError(
                f"source=kafka does not take {', '.join(f'kafka.{k}' for k in given) or 'kafka.' + ignored[0]!r}: "
                f"librdkafka says its consumer would ignore {ignored[0]} (a producer setting): remove it")

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
            wanted = {t: sorted(m.partitions) for t, m in topics.items() if self.pattern.search(t)}
        else:
            assert self.assign is not None
            wanted = {t: [p for p in ps if p in topics[t].partitions] for t, ps in self.assign.items() if t in topics}
        for topic in self._internal_topics(sorted(wanted)):  # Spark reads no internal topic, whatever the options
            del wanted[topic]
        found = {region_of(topic, p): PartitionSplit(topic, p) for topic, parts in wanted.items() for p in parts}
        self._splits.update(found)
        return found

    def _internal_topics(self, topics: list[str]) -> list[str]:
        """Those of ``topics`` the broker marks internal, as Spark's Kafka source leaves out (its admin client's
        listTopics and describeTopics' isInternal): ``__consumer_offsets`` and the like, never a user's ``__x``."""
        unknown = [t for t in topics if t.startswith(INTERNAL_PREFIX) and t not in self._internal]
        if unknown:
            from confluent_kafka import TopicCollection

            futures = self.admin().describe_topics(TopicCollection(unknown), request_timeout=self.metadata_timeout_s)
            for topic, future in futures.items():
                try:
                    self._internal[topic] = bool(future.result().is_internal)
                except Exception as exc:  # deleted meanwhile, or not to be described: Kafka's own list decides
                    log.debug("regional: could not describe topic %r (%s): judged by its name", topic, exc)
                    return [t for t in topics if self._internal.get(t, t in KAFKA_INTERNAL_TOPICS)]
        return [t for t in topics if self._internal.get(t, False)]

    def _describe(self) -> str:
        if self.subscribe is not None:
            return f"subscribe {','.join(self.subscribe)}"
        if self.pattern is not None:
            return f"subscribePattern {self.pattern_text!r}"
        return f"assign {json.dumps(self.assign)}"

    def _offsets(self, splits: Mapping[str, PartitionSplit], latest: bool = False,
                 times: Mapping[str, int] | None = None) -> dict[str, int]:
        """Each partition's earliest or latest offset; or, with ``times`` (region -> milliseconds), its first offset
        whose record's timestamp is at or after it, -1 where there is none (Kafka's offsets-for-times)."""
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        if not splits:
            return {}
        what = "latest" if latest else "earliest" if times is None else "by-timestamp"
        plain = OffsetSpec.latest() if latest else OffsetSpec.earliest()

        def spec(region: str) -> Any:
            return plain if times is None else OffsetSpec.for_timestamp(times[region])

        level = (IsolationLevel.READ_COMMITTED if self.consumer_conf["isolation.level"] == "read_committed"
                 else IsolationLevel.READ_UNCOMMITTED)
        asked = {region: TopicPartition(s.topic, s.partition) for region, s in splits.items()}
        result: dict[str, int] = {}
        deadline = time.monotonic() + self.metadata_timeout_s
        retries = 0
        while True:  # after a broker restart, leaders and their epochs settle within moments: ask again
            todo = {r: tp for r, tp in asked.items() if r not in result}
            if not todo:
                return result
            futures = self.admin().list_offsets({tp: spec(r) for r, tp in todo.items()}, isolation_level=level,
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
            if (time.monotonic() > deadline if self.offset_retries is None else retries >= self.offset_retries):
                region, first = next(iter(sorted(errors.items())))
                after = (f"within {self.metadata_timeout_s:.0f} s" if self.offset_retries is None
                         else f"after {retries} retries (fetchOffset.numRetries)")
                raise KafkaError(f"source=kafka: could not list the {what} offset of region {region!r} {after} "
                                 f"({first})")
            retries += 1
            self._admin = None  # a fresh client: librdkafka's cached leader epochs can stay stale (measured)
            time.sleep(self.retry_interval_s)
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
            return self.pattern.search(topic) is not None
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
        """Where the partitions present when a new query starts begin: ``startingOffsets``, ``startingTimestamp`` or
        ``startingOffsetsByTimestamp``, as Spark's Kafka source resolves them."""
        starts = self.log_starts()
        start = self.starting
        if start.kind in ("earliest", "latest"):
            chosen = starts if start.kind == "earliest" else available
            return {r: chosen[r] for r in available}
        if start.kind == "timestamp":
            assert start.timestamp is not None
            return self._at_times({r: start.timestamp for r in available}, available, "startingTimestamp")
        assert start.per_partition is not None
        named = {region_of(t, p): o for t, ps in start.per_partition.items() for p, o in ps.items()}
        option = "startingOffsets" if start.kind == "offsets" else "startingOffsetsByTimestamp"
        unknown = sorted(set(named) - set(available))
        if unknown:
            raise RegionalConfigError(f"source=kafka: {option} names partitions this query does not read: "
                                      f"{', '.join(unknown[:10])}")
        unnamed = sorted(set(available) - set(named))
        if unnamed:
            raise RegionalConfigError(
                f"source=kafka: {option} gives no {'offset' if start.kind == 'offsets' else 'timestamp'} for "
                f"{', '.join(unnamed[:10])}; as with Spark's Kafka source, name every partition"
                + (" (-2 for earliest, -1 for latest)" if start.kind == "offsets" else ""))
        if start.kind == "timestamps":
            return self._at_times(named, available, option)
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

    def _at_times(self, times: Mapping[str, int], available: Mapping[str, int], option: str) -> dict[str, int]:
        """Each region's first offset whose record's timestamp is at or after its time. A region with none follows
        startingOffsetsByTimestampStrategy: ``error`` refuses to start (Spark fails the query), ``latest`` starts it
        at its end."""
        found = self._offsets({r: self._splits[r] for r in times}, times=times)
        missing = sorted(r for r, o in found.items() if o < 0)
        if missing and self.starting.no_match == "error":
            raise RegionalConfigError(
                f"source=kafka: {option}: no record at or after timestamp {times[missing[0]]} in "
                f"{', '.join(missing[:10])}; set startingOffsetsByTimestampStrategy=latest to start such partitions "
                "at their end (as Spark's Kafka source does with it), or choose an earlier time")
        # The end was listed a moment before the times: a record that came in between is read by the next epoch.
        return {r: available[r] if o < 0 else min(o, available[r]) for r, o in found.items()}

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

    def _read_conf(self) -> dict[str, Any]:
        """The configuration of a task's consumer."""
        return self._conf(**{
            "group.id": self.reader_group, "enable.auto.commit": False,
            "enable.partition.eof": True, "auto.offset.reset": "error",
            # A consumer that reached the log's end has a fetch waiting at the broker for this long, and a pooled
            # consumer's next range waited for it (500 ms by default; measured). A task reads records that exist.
            "fetch.wait.max.ms": self.consumer_conf.get("fetch.wait.max.ms", FETCH_WAIT_MS)})

    def read(self, region: str, start: int, end: int, split: Any,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """Offsets ``[start, end)`` of one partition, stopping exactly at ``end``. Gaps (transaction markers,
        aborted or compacted records) are skipped; the end of the partition's readable log also ends the read,
        so a marker at ``end - 1`` is never waited for."""
        from confluent_kafka import KafkaError as RdKafkaError
        from confluent_kafka import TopicPartition

        assert isinstance(split, PartitionSplit)
        conf = self._read_conf()
        consumer, reused = CONSUMERS.take(conf)
        finished = False
        try:
            consumer.assign([TopicPartition(split.topic, split.partition, start)])
            rows = _Rows(region, split, self.include_headers, self.batch_bytes)
            deadline = time.monotonic() + self.poll_timeout_s
            silent_since: float | None = None
            done = start >= end
            while not done:
                # librdkafka's consume() returns when it has num_messages or at the timeout: ask for no more than
                # the range can still hold, or every task waits out the timeout at its range's end (0.5 s each).
                left = end - (start if rows.next_offset is None else rows.next_offset)
                messages = consumer.consume(num_messages=rows.lot_size(min(batch_rows - len(rows), left)), timeout=0.2)
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
                    offsets = _offsets_of(records, region)
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
                    for batch in rows.add(records, offsets, self.schema):
                        yield batch
                        deadline = time.monotonic() + self.poll_timeout_s  # Spark held the batch: not Kafka's wait
                if len(rows) >= batch_rows or (done and len(rows)):
                    yield rows.batch(self.schema)
                    deadline = time.monotonic() + self.poll_timeout_s
                if not done and time.monotonic() > deadline:
                    raise KafkaError(
                        f"region {region!r}: no record of [{start}, {end}) arrived for {self.poll_timeout_s:.0f} s "
                        f"(read up to {rows.next_offset}); is the broker up? kafkaConsumer.pollTimeoutMs sets the wait")
            finished = True
        finally:
            CONSUMERS.give_back(conf, consumer, reusable=finished)




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


