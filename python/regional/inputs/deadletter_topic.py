"""``source=deadLetters``, ``topic=<dead-letter topic>``: replay the records a query dead-lettered to Kafka.

A query with ``deadLetterTopic`` produces each record isolated as poison to that topic (``regional.targets.
kafka_topic``), with headers that say where it came from (``regional.region``, ``regional.offset``) and what
it was (``regional.schema``; ``regional.row`` for a Kafka source's record). This source reads them back as
that source's records, as ``path=<dead-letter table>`` does for a table (``regional.inputs.deadletters``): the
same columns, regions and offsets (sparse), so the same select runs again into the same target.

Options: ``topic``, ``kafka.bootstrap.servers`` and the consumer's ``kafka.*`` settings, by the Kafka
source's rules (``kafka.group.id`` and ``kafka.isolation.level`` are regional's: letters are read
``read_committed``, never one of an aborted transaction); ``replayGroup`` (default
``regional-replayed-<topic>``); ``metadataTimeoutMs`` and ``kafkaConsumer.pollTimeoutMs`` as the Kafka source.

- The index. The driver reads the topic's headers (every letter from where this replay began to the end of
  its readable log; a dead-letter topic is small) into an index: region -> (original offset, partition,
  position). An epoch's tasks read the positions of their range's letters, found in the index with the topic's
  ends kept for that epoch in the store (``before_splits``): a re-run reads the same letters. The source's
  schema is every letter's ``regional.schema`` together (a letter without a column gets null).
- Marks: a topic's records cannot be changed, so "which letters were replayed" is the consumer group
  ``replayGroup``: after each recorded epoch, each partition's committed offset is its first letter not yet
  replayed (published or dead-lettered again), and its metadata names this query, the epoch, and the letters
  beyond that offset already replayed (``above``). A new replay (a new checkpointLocation) starts each partition
  there and skips ``above``: it takes only what no replay took. Too many of those to fit in the metadata
  (4 KB) and a new replay refuses to start, rather than read them twice; the replay that made them goes on from
  its own checkpoint.
- A letter below where this replay already is (late), one deleted by the topic's retention before this replay
  read it, or a topic created again, fails the replay, saying so: absence is never success.

Where each method runs: the index, ``available``, ``before_splits``, ``split`` and ``on_recorded`` on the driver
(``on_recorded`` also in the sink's phase two when no ``kafka.*`` option is a credential: ``phase_two_options``);
``read`` in the task, with a consumer of its own that reads only the positions in its split.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import functools
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from regional import failpoints
from regional.dead_letters import DeadLetterSummary
from regional.errors import RegionalConfigError, RegionalStoreError
from regional.inputs.base import BATCH_ROWS, AcknowledgingInput, RegionInput, StoredInput
from regional.inputs.deadletters import plain_type, spark_ddl
from regional.inputs.kafka import FETCH_WAIT_MS, KafkaError, client_log
from regional.kafka_group import committed
from regional.protocol.settings import parse_int
from regional.store.model import EpochRecord
from regional.targets import TOPIC_PLACE

if TYPE_CHECKING:
    from regional.store import Store
    from regional.store.source_log import SourceLog

log = logging.getLogger("regional.kafka")

HEADER = "regional."
KEPT_VERSIONS = 4  # the topic's ends of the last few epochs, kept in the store
# consume() returns when it has its messages or at this timeout: short, as a read ends at the log's end or at its
# last letter, seldom at a thousand records (measured: 0.2 s was 0.2 s per task and per index read)
POLL_S = 0.02
MAX_MARK_METADATA = 3500  # bytes of a partition's mark (the brokers' offset.metadata.max.bytes is 4096 by default)
# kafka.* keys that may hold a credential: the options that build this source in the sink's phase two go into the
# plan (Spark's offset log), so with one of these the marks are made by the reader only.
SECRET_KEY = re.compile(r"password|secret|jaas|token|keytab|oauthbearer|credential|key\.pem|private|\.key$")
REFUSED = {
    "kafka.group.id": "replayGroup (the group that keeps which letters were replayed)",
    "kafka.enable.auto.commit": "nothing (the marks are committed after each recorded epoch)",
    "kafka.auto.offset.reset": "nothing (a replay reads every letter no replay has taken)",
}


class Letter:
    """One dead letter in the index: where it is in the topic, and which record it was."""

    __slots__ = ("offset", "partition", "position", "region")

    def __init__(self, partition: int, position: int, region: str, offset: int) -> None:
        self.partition, self.position, self.region, self.offset = partition, position, region, offset


@dataclass(frozen=True)
class TopicSplit:
    """The positions (partition, offset in the topic) of a range's letters, in their original offsets' order."""

    positions: tuple[tuple[int, int], ...]


class DeadLetterTopicInput(RegionInput[TopicSplit], StoredInput, AcknowledgingInput):
    schema: pa.Schema
    schema_ddl: str
    sparse = True

    def __init__(self, options: Mapping[str, str], read_letters: bool = True) -> None:
        """``read_letters`` False: no index and no schema yet (``topic_summary`` reads the letters itself)."""
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            raise RegionalConfigError("source=deadLetters with a topic needs confluent-kafka: pip install "
                                      "'regional[kafka]'") from None
        opts = {k.lower(): str(v) for k, v in options.items()}
        self.topic = opts.get("topic", "").strip()
        self.bootstrap = opts.get("kafka.bootstrap.servers", "")
        if not self.bootstrap:
            raise RegionalConfigError(f"source=deadLetters, topic={self.topic}: add .option('kafka.bootstrap."
                                      "servers', 'host:9092'), the brokers of the dead-letter topic")
        for key, instead in REFUSED.items():
            if key in opts:
                raise RegionalConfigError(f"source=deadLetters does not take {key!r}: use {instead}")
        isolation = opts.get("kafka.isolation.level", "read_committed")
        if isolation != "read_committed":
            raise RegionalConfigError("source=deadLetters reads a dead-letter topic read_committed (a letter of an "
                                      "aborted transaction was never dead-lettered): drop "
                                      f"kafka.isolation.level={isolation}")
        self.group = opts.get("replaygroup") or f"regional-replayed-{self.topic}"
        self.metadata_timeout_s = parse_int(opts, "metadataTimeoutMs", minimum=1, default="30000") / 1000
        self.poll_timeout_s = parse_int(opts, "kafkaConsumer.pollTimeoutMs", minimum=1, default="120000") / 1000
        self.consumer_conf = {k[len("kafka."):]: v for k, v in opts.items()
                              if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
        self._acknowledge: dict[str, str] | None = None
        if not any(SECRET_KEY.search(k) for k in self.consumer_conf):
            self._acknowledge = {"source": "deadLetters", "topic": self.topic,
                                 **{k: v for k, v in opts.items() if k.startswith("kafka.")},
                                 **{k: v for k, v in options.items() if k.lower() in (
                                     "replaygroup", "metadatatimeoutms", "kafkaconsumer.polltimeoutms")}}
        self._store: Store | None = None
        self._log: SourceLog | None = None
        self._state: dict[str, Any] | None = None  # from, above (skipped), versions: as kept in the store
        self._letters: list[Letter] = []  # every letter read from the topic, in the order read
        self._next: dict[int, int] = {}  # each partition's next position to read into the index
        self._committed: dict[str, int] = {}  # each region's committed offset as of epoch _committed_epoch's record
        self._committed_epoch: int | None = None
        self._split_ends: dict[int, int] | None = None  # the topic's ends kept for the epoch being split
        if not read_letters:
            return
        schemas = self._read_topic(initial=True)
        if not schemas:
            raise RegionalConfigError(
                f"source=deadLetters: the dead-letter topic {self.topic} at {self.bootstrap} has no dead letters "
                "(or does not exist): nothing to replay yet; the schema of a replay is its letters'")
        try:
            merged = pa.unify_schemas(schemas)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise RegionalConfigError(f"source=deadLetters: the letters in {self.topic} have columns of "
                                      f"conflicting types ({exc}): replay each schema's letters apart") from None
        self.schema = pa.schema([plain_type(f) for f in merged])
        if self.schema.names[:2] != ["region", "offset"]:
            raise RegionalConfigError(f"source=deadLetters: the letters in {self.topic} are not regional dead "
                                      f"letters (their columns are {self.schema.names[:6]})")
        self.schema_ddl = spark_ddl(self.schema)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # tasks read the positions in their split: none of the driver's index or store
        state.update(_store=None, _log=None, _state=None, _letters=[], _next={}, _committed={}, _split_ends=None)
        return state

    def __repr__(self) -> str:  # never the consumer's settings
        return f"DeadLetterTopicInput({self.topic!r}, brokers={self.bootstrap!r})"

    def _conf(self, **extra: Any) -> dict[str, Any]:
        # A consumer that reached the log's end has a fetch waiting at the broker (500 ms by default): the index
        # and the tasks read letters that exist, to the end (as the Kafka source's tasks do).
        return {"bootstrap.servers": self.bootstrap, "fetch.wait.max.ms": FETCH_WAIT_MS, **self.consumer_conf,
                "isolation.level": "read_committed", "enable.auto.commit": False, "logger": client_log, **extra}

    def table_location(self) -> str:
        return TOPIC_PLACE + self.topic

    def use_store(self, store: Store) -> None:
        self._store, self._log, self._state = store, store.source_log("deadletters_topic"), None

    def phase_two_options(self) -> dict[str, str] | None:
        return self._acknowledge

    # -- the index, on the driver ----------------------------------------------------------------

    def _read_topic(self, initial: bool = False,
                    visit: Callable[[Letter, dict[str, bytes]], None] | None = None) -> list[pa.Schema]:
        """Read the topic's letters from each partition's next position to the end of its readable log into the
        index (each also to ``visit``, with its headers); their schemas (only those of letters not seen before,
        and only when ``initial``)."""
        from confluent_kafka import KafkaError as RdKafkaError
        from confluent_kafka import TopicPartition

        consumer = _consumer(self._conf(**{"group.id": self.group, "enable.partition.eof": True,
                                           "auto.offset.reset": "error"}))
        schemas: dict[bytes, pa.Schema] = {}
        try:
            meta = consumer.list_topics(self.topic, timeout=self.metadata_timeout_s).topics.get(self.topic)
            if meta is None or meta.error is not None or not meta.partitions:
                return []
            todo: dict[int, int] = {}
            for p in sorted(meta.partitions):
                low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                           timeout=self.metadata_timeout_s)
                start = self._next.get(p, low)
                if start < low:
                    raise RegionalStoreError(
                        f"source=deadLetters: letters of {self.topic} partition {p} from position {start} were "
                        f"deleted (the topic's retention, or the topic was created again; it now starts at {low}) "
                        "before this replay read them: they were never replayed. Restore them, or replay what is "
                        "left with a new checkpointLocation")
                if start > high:
                    raise RegionalStoreError(
                        f"source=deadLetters: {self.topic} partition {p} ends at {high}, before position {start} "
                        "this replay already read: the topic was created again. Replay it with a new "
                        "checkpointLocation")
                self._next[p] = start
                if start < high:
                    todo[p] = start
            if not todo:
                return []
            consumer.assign([TopicPartition(self.topic, p, o) for p, o in todo.items()])
            deadline = time.monotonic() + self.metadata_timeout_s
            while todo:
                messages = consumer.consume(num_messages=1000, timeout=POLL_S)
                for m in messages:
                    error = m.error()
                    if error is not None:
                        if error.code() == RdKafkaError._PARTITION_EOF and m.partition() in todo:
                            # the end of the readable log: past the last letter (transaction markers, aborted
                            # records); a letter that arrives later is read by the next call
                            del todo[m.partition()]
                            self._next[m.partition()] = max(self._next[m.partition()], m.offset() or 0)
                        elif not error.retriable():
                            raise KafkaError(f"source=deadLetters: reading {self.topic} failed: {error}")
                        continue
                    p, position = m.partition(), m.offset()
                    if p not in todo or position < self._next[p]:
                        continue
                    headers = _headers(m)
                    region, offset = headers.get(HEADER + "region"), headers.get(HEADER + "offset")
                    schema = headers.get(HEADER + "schema")
                    if region is None or offset is None or schema is None:
                        raise RegionalConfigError(
                            f"source=deadLetters: the record at {self.topic} partition {p} position {position} is "
                            "not a regional dead letter (no regional.region, regional.offset or regional.schema "
                            "header): a replay reads a topic only regional's deadLetterTopic writes")
                    letter = Letter(p, position, region.decode(), int(offset))
                    self._letters.append(letter)
                    if visit is not None:
                        visit(letter, headers)
                    self._next[p] = position + 1
                    if initial and schema not in schemas:
                        schemas[schema] = _schema(schema)
                if messages:
                    deadline = time.monotonic() + self.metadata_timeout_s
                elif time.monotonic() > deadline:
                    raise KafkaError(f"source=deadLetters: {self.topic} at {self.bootstrap} did not answer within "
                                     f"{self.metadata_timeout_s:.0f} s (metadataTimeoutMs); is the broker up?")
        finally:
            consumer.close()
        return list(schemas.values())

    def _kept(self) -> dict[str, Any]:
        """What this replay keeps in its store: where it began in each partition (the group's marks when it first
        started), the letters beyond those that earlier replays took, and the topic's ends per epoch."""
        if self._state is None:
            assert self._log is not None, "use_store() first"
            loaded = self._log.load()
            if loaded:
                self._state = loaded[0]
            else:
                began, above = self._group_marks()
                self._state = {"from": {str(p): o for p, o in began.items()},
                               "above": {str(p): sorted(a) for p, a in above.items()}, "versions": {}}
                self._log.write_snapshot(self._state)
        return self._state

    def _group_marks(self) -> tuple[dict[int, int], dict[int, list[int]]]:
        """``replayGroup``'s committed offsets and the letters beyond them already replayed, per partition."""
        from confluent_kafka import TopicPartition

        partitions = sorted({letter.partition for letter in self._letters} | set(self._next))
        if not partitions:
            return {}, {}
        consumer = _consumer(self._conf(**{"group.id": self.group}))
        try:
            marks = committed(consumer, [TopicPartition(self.topic, p) for p in partitions], self.metadata_timeout_s)
        finally:
            consumer.close()
        began: dict[int, int] = {}
        above: dict[int, list[int]] = {}
        for tp in marks:
            if tp.offset < 0:
                continue
            began[tp.partition] = tp.offset
            meta = _mark(tp.metadata)
            if meta.get("above") is None and meta.get("whole") is False:
                raise RegionalStoreError(
                    f"source=deadLetters: replay {meta.get('replayed_by')!r} took letters of {self.topic} partition "
                    f"{tp.partition} beyond its mark (position {tp.offset}), too many to name in group {self.group!r}: "
                    "a new replay would read them again. Let that replay go on from its own checkpointLocation, or "
                    "give this one another replayGroup after deciding what it may read")
            above[tp.partition] = [int(o) for o in meta.get("above") or []]
        return began, above

    def _available_letters(self, ends: Mapping[int, int] | None = None) -> dict[str, list[Letter]]:
        """The letters this replay reads, by region in original offset order (one record dead-lettered twice:
        its first letter); with ``ends``, only those below each partition's end then."""
        state = self._kept()
        began = {int(p): int(o) for p, o in state["from"].items()}
        skipped = {(int(p), int(o)) for p, os in state["above"].items() for o in os}
        out: dict[str, dict[int, Letter]] = {}
        for letter in self._letters:
            if letter.position < began.get(letter.partition, 0) or (letter.partition, letter.position) in skipped:
                continue
            if ends is not None and letter.position >= ends.get(letter.partition, 0):
                continue
            out.setdefault(letter.region, {}).setdefault(letter.offset, letter)
        return {r: [by_offset[o] for o in sorted(by_offset)] for r, by_offset in out.items()}

    # -- planning, on the driver -------------------------------------------------------------------

    def available(self, epoch: int) -> dict[str, int]:
        self._read_topic()
        # A letter is late if its region's committed offset passed it, as of the last record, but the tasks that
        # moved the region there could not see it (it is past the topic's ends kept for that epoch).
        seen = self._ends_of(self._committed_epoch) or {}
        letters = self._available_letters()
        late = sorted((letter.region, letter.offset) for region, ls in letters.items() for letter in ls
                      if letter.offset < self._committed.get(region, 0)
                      and letter.position >= seen.get(letter.partition, 0))
        if late:
            region, offset = late[0]
            raise RegionalStoreError(
                f"source=deadLetters: {len(late)} letter(s) reached {self.topic} after this replay had passed their "
                f"offsets (e.g. region {region!r} at offset {offset}, below its committed offset "
                f"{self._committed[region]}): two queries share the topic, its query started again from earlier "
                "offsets, or one record was dead-lettered twice. This replay would never read them: replay them with "
                "a new checkpointLocation (it takes only letters no replay has marked in replayGroup)")
        return {region: ls[-1].offset + 1 for region, ls in letters.items()}

    def before_splits(self, epoch: int) -> None:
        """The epoch's tasks read the letters below the topic's ends as planned, kept in the store: a re-run
        reads the same letters, and the marks cover what it read."""
        state = self._kept()
        if str(epoch) not in state["versions"]:
            state["versions"][str(epoch)] = {str(p): o for p, o in self._next.items()}
            for old in sorted(state["versions"], key=int)[:-KEPT_VERSIONS]:
                del state["versions"][old]
            assert self._log is not None
            self._log.write_snapshot(state)
        self._split_ends = {int(p): int(o) for p, o in state["versions"][str(epoch)].items()}

    def _ends_of(self, epoch: int | None) -> dict[int, int] | None:
        """The topic's ends kept for ``epoch`` (what its tasks could read); None if not kept."""
        ends = None if epoch is None else self._kept()["versions"].get(str(epoch))
        return None if ends is None else {int(p): int(o) for p, o in ends.items()}

    def split(self, region: str, start: int, end: int) -> TopicSplit:
        ends = self._split_ends
        if ends is None:
            raise RegionalStoreError("source=deadLetters: split() before before_splits(): a reader bug")
        letters = self._available_letters(ends).get(region, [])
        return TopicSplit(tuple((letter.partition, letter.position) for letter in letters
                                if start <= letter.offset < end))

    def on_recorded(self, record: EpochRecord) -> None:
        """Mark in ``replayGroup`` what this replay has published or dead-lettered again, as of ``record``: each
        partition's first letter not replayed, and the letters beyond it that were."""
        from confluent_kafka import TopicPartition

        self._committed = {r: s.committed_offset for r, s in record.regions.items()}
        self._committed_epoch = record.epoch
        if not self._letters:
            self._read_topic()
        state = self._kept()
        # Replayed: below its region's committed offset and visible to the epoch's tasks (a late letter, past the
        # ends kept for the epoch, was never read: the next plan fails on it, and it must stay unmarked).
        seen = self._ends_of(record.epoch)
        if seen is None:  # not kept (an old epoch heard late): the next epoch's marks cover it
            log.info("regional: source=deadLetters: no topic ends kept for epoch %d; its marks wait for the next",
                     record.epoch)
            return
        skipped = {(int(p), int(o)) for p, os in state["above"].items() for o in os}
        began = {int(p): int(o) for p, o in state["from"].items()}
        replayed: dict[int, list[int]] = {}
        waiting: dict[int, int] = {}
        for letter in self._letters:
            p = letter.partition
            if letter.position < began.get(p, 0):
                continue
            if (p, letter.position) in skipped or (letter.offset < self._committed.get(letter.region, 0)
                                                   and letter.position < seen.get(p, 0)):
                replayed.setdefault(p, []).append(letter.position)
            else:
                waiting[p] = min(waiting.get(p, letter.position), letter.position)
        marks = []
        for p in sorted(set(replayed) | set(waiting)):
            mark = waiting.get(p, self._next.get(p, 0))
            above = sorted(o for o in replayed.get(p, []) if o > mark)
            meta = {"replayed_by": self._query_id(), "epoch": record.epoch, "above": above}
            text = json.dumps(meta, separators=(",", ":"))
            if len(text) > MAX_MARK_METADATA:
                text = json.dumps({"replayed_by": self._query_id(), "epoch": record.epoch, "above": None,
                                   "whole": False}, separators=(",", ":"))
            marks.append(TopicPartition(self.topic, p, mark, metadata=text))
        if not marks:
            return
        failpoints.reach("before_marks", record.epoch)
        consumer = _consumer(self._conf(**{"group.id": self.group}))
        try:
            current = committed(consumer, [TopicPartition(self.topic, tp.partition) for tp in marks],
                                 self.metadata_timeout_s)
            newer = [tp for tp in current if _mark(tp.metadata).get("replayed_by") == self._query_id()
                     and int(_mark(tp.metadata).get("epoch", -1)) > record.epoch]
            if newer:  # a later epoch's marks are there already: never go back
                return
            consumer.commit(offsets=marks, asynchronous=False)
        except Exception as exc:
            raise KafkaError(f"source=deadLetters: could not mark epoch {record.epoch}'s letters as replayed in group "
                             f"{self.group!r} of {self.topic} ({exc}); the next start marks them") from None
        finally:
            consumer.close()

    def _query_id(self) -> str:
        query_id = self._store.query_id() if self._store is not None else None
        if not query_id:
            raise RegionalStoreError("source=deadLetters: the replay's regional store has no query id yet")
        return query_id

    # -- in the task -----------------------------------------------------------------------------

    def read(self, region: str, start: int, end: int, split: TopicSplit,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import KafkaError as RdKafkaError
        from confluent_kafka import TopicPartition

        if not split.positions:
            return
        wanted: dict[int, set[int]] = {}
        for p, o in split.positions:
            wanted.setdefault(p, set()).add(o)
        found: dict[tuple[int, int], Any] = {}
        consumer = _consumer(self._conf(**{"group.id": "regional-reader", "enable.partition.eof": True,
                                           "auto.offset.reset": "error"}))
        try:
            consumer.assign([TopicPartition(self.topic, p, min(os)) for p, os in wanted.items()])
            todo = {p: max(os) for p, os in wanted.items()}
            deadline = time.monotonic() + self.poll_timeout_s
            while todo:
                messages = consumer.consume(num_messages=1000, timeout=POLL_S)
                for m in messages:
                    error = m.error()
                    if error is not None:
                        if error.code() == RdKafkaError._PARTITION_EOF:
                            if m.partition() in todo:
                                raise RegionalStoreError(
                                    f"region {region!r}: the letters of [{start}, {end}) in {self.topic} partition "
                                    f"{m.partition()} end before position {todo[m.partition()]}: deleted (retention) "
                                    "or the topic was created again; they cannot be replayed")
                        elif error.code() == RdKafkaError._AUTO_OFFSET_RESET or "out of range" in str(error).lower():
                            raise RegionalStoreError(f"region {region!r}: letters of {self.topic} are no longer in "
                                                     f"the topic (deleted by retention?): {error}")
                        elif not error.retriable():
                            raise KafkaError(f"region {region!r}: reading {self.topic} failed: {error}")
                        continue
                    p, position = m.partition(), m.offset()
                    if position in wanted.get(p, ()):
                        found[(p, position)] = m
                    if p in todo and position >= todo[p]:
                        del todo[p]
                if messages:
                    deadline = time.monotonic() + self.poll_timeout_s
                elif time.monotonic() > deadline:
                    raise KafkaError(f"region {region!r}: {self.topic} gave no letter for {self.poll_timeout_s:.0f} "
                                     "s; is the broker up? kafkaConsumer.pollTimeoutMs sets the wait")
        finally:
            consumer.close()
        rows = []
        for p, o in split.positions:
            m = found.get((p, o))
            if m is None:
                raise RegionalStoreError(f"region {region!r}: the letter at {self.topic} partition {p} position {o} "
                                         "is gone (an aborted transaction's, or deleted): it cannot be replayed")
            row = self._row(m)
            if row.get("region") != region or not (start <= int(row.get("offset", -1)) < end):
                raise RegionalStoreError(f"the letter at {self.topic} partition {p} position {o} is region "
                                         f"{row.get('region')!r} offset {row.get('offset')}, not one of region "
                                         f"{region!r}'s [{start}, {end}): the topic was created again")
            rows.append(row)
        table = pa.Table.from_pylist(rows, schema=self.schema)
        yield from table.to_batches(max_chunksize=batch_rows)

    def _row(self, m: Any) -> dict[str, Any]:
        """A letter as the row its source read, typed by the replay's schema."""
        pairs = m.headers() or []
        headers = _headers(m)
        letter_schema = _schema(headers[HEADER + "schema"])
        if HEADER + "row" in headers:  # a Kafka source's record: its key, value and own headers, then the rest
            raw = json.loads(headers[HEADER + "row"])
            raw["key"], raw["value"] = m.key(), m.value()
            if "headers" in letter_schema.names:
                own = int(headers.get(HEADER + "source.headers", b"0"))
                raw["headers"] = [{"key": k, "value": v} for k, v in pairs[:own]]
        else:
            raw = json.loads(m.value())
        unknown = [n for n in raw if n not in self.schema.names]
        if unknown:
            raise RegionalStoreError(f"the letter at {self.topic} partition {m.partition()} position {m.offset()} "
                                     f"has columns {unknown} this replay's schema lacks (a letter that arrived after "
                                     "the replay started, of a changed schema): start the replay again")
        return {f.name: _typed(raw.get(f.name), f.type) for f in self.schema}


def topic_summary(options: Mapping[str, str]) -> DeadLetterSummary:
    """``python -m regional dead-letters kafka:<topic>``: the letters in the topic (``options`` as the replay's:
    ``topic``, ``kafka.bootstrap.servers``, ``kafka.*``, ``replayGroup``), which of them a replay took (the
    group's marks), by region and error class."""
    source = DeadLetterTopicInput(options, read_letters=False)
    out = DeadLetterSummary(TOPIC_PLACE + source.topic, None)
    seen: list[tuple[Letter, int, str]] = []

    def visit(letter: Letter, headers: dict[str, bytes]) -> None:
        error = headers.get(HEADER + "error.class", b"unknown").decode(errors="replace")
        message = headers.get(HEADER + "error.message", b"").decode(errors="replace")
        epoch = headers.get(HEADER + "epoch")
        seen.append((letter, int(epoch) if epoch is not None else -1, f"{error}: {message}" if message else error))

    source._read_topic(visit=visit)
    began, above = source._group_marks()
    skipped = {(p, o) for p, os in above.items() for o in os}
    for letter, epoch, error in seen:
        replayed = letter.position < began.get(letter.partition, 0) or (letter.partition, letter.position) in skipped
        out.add(letter.region, letter.offset, epoch, error, replayed)
    return out


def _typed(value: Any, kind: pa.DataType) -> Any:
    """A JSON value (as ``kafka_topic`` wrote it: bytes as base64, times as ISO text) as Arrow takes ``kind``."""
    if value is None or isinstance(value, bytes):
        return value
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return base64.b64decode(value)
    if pa.types.is_timestamp(kind):
        return datetime.datetime.fromisoformat(value)
    if pa.types.is_date(kind):
        return datetime.date.fromisoformat(value)
    if pa.types.is_decimal(kind):
        return decimal.Decimal(value)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return [_typed(v, kind.value_type) for v in value]
    if pa.types.is_map(kind):
        return [(_typed(k, kind.key_type), _typed(v, kind.item_type)) for k, v in
                (value.items() if isinstance(value, dict) else value)]
    if pa.types.is_struct(kind):
        return {kind.field(i).name: _typed(value.get(kind.field(i).name), kind.field(i).type)
                for i in range(kind.num_fields)}
    return value


@functools.lru_cache(maxsize=64)  # every letter of a query carries the same few schemas
def _schema(header: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(header)))


def _headers(m: Any) -> dict[str, bytes]:
    """The letter's headers by name; regional's come last, so the last of a name wins."""
    return {k: v for k, v in (m.headers() or []) if v is not None}


def _mark(metadata: str | None) -> dict[str, Any]:
    try:
        value = json.loads(metadata or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _consumer(conf: Mapping[str, Any]) -> Any:
    from confluent_kafka import Consumer

    return Consumer(dict(conf))
