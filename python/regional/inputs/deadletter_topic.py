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
  its readable log; a dead-letter topic is small) into an index: record (original region, offset) -> its
  letters (partition, position). The same letter twice (one record dead-lettered twice) is one record, read
  once; two different letters of one record (two queries on one topic) fail the replay. The source's schema
  is every letter's ``regional.schema`` together (a letter without a column gets null).
- Each plan (``available``) keeps in the store, before it returns, the topic's ends its tasks read below and,
  per partition, the first letters this replay still owes (position, region, offset): retention deletes from
  the start, so a log start past one of them, not replayed since, is a loss (``failOnDataLoss``, default true,
  as the Kafka source), and a different letter there means the topic was created again. An epoch's tasks read
  the positions of their range's letters found below those ends (``before_splits``, ``split``): a re-run
  reads the same letters. Probes read this replay's own replayed letters, never those it dead-lettered again
  nor another replay's.
- Marks: a topic's records cannot be changed, so "which letters were replayed" is the consumer group
  ``replayGroup``: after each recorded epoch, each partition's committed offset is its first letter not yet
  replayed (published or dead-lettered again) by this replay or any other, and its metadata names this query,
  the epoch, and the spans of letters beyond that offset already replayed (``above``). Every plan reads the
  group, and keeps in the store what another replay took: a replay never takes a letter another replay's marks
  hold, and a new replay (a new checkpointLocation) begins there. Too many spans to fit in the metadata
  (4 KB), and another replay refuses to start rather than read them twice. The marks live as long as the
  group's offsets (``offsets.retention.minutes``).
- A letter below where this replay already is (late), one deleted by the topic's retention before any replay
  took it, or a topic created again, fails the replay, saying so: absence is never success.

Where each method runs: the index, ``available``, ``before_splits``, ``split`` and ``on_recorded`` on the driver
(``on_recorded`` also in the sink's phase two when no ``kafka.*`` option is a credential: ``phase_two_options``);
``read`` in the task, with a consumer of its own that reads only the positions in its split.
"""

from __future__ import annotations

import base64
import bisect
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
from regional.errors import RegionalConfigError, RegionalDataLossError, RegionalStoreError
from regional.inputs.base import BATCH_ROWS, AcknowledgingInput, RegionInput, StoredInput
from regional.inputs.deadletters import plain_type, spark_ddl
from regional.inputs.kafka import FETCH_WAIT_MS, KafkaError, client_log
from regional.kafka_group import committed
from regional.protocol.settings import parse_bool, parse_int
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
OWED_KEPT = 1000  # per partition, the first letters a replay owes, kept in the store (retention deletes the first)
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

    __slots__ = ("digest", "offset", "partition", "position", "region")

    def __init__(self, partition: int, position: int, region: str, offset: int, digest: int = 0) -> None:
        self.partition, self.position, self.region, self.offset = partition, position, region, offset
        self.digest = digest  # of its key, value and row: two letters of one record are the same letter twice

    @property
    def at(self) -> tuple[int, int]:
        return self.partition, self.position


class Takes:
    """What a group's marks say of one partition: every letter below ``mark`` was replayed, and every letter in
    the ``runs`` (inclusive position spans) beyond it."""

    def __init__(self, mark: int = 0, runs: tuple[tuple[int, int], ...] = ()) -> None:
        self.mark, self.runs = mark, tuple(sorted(runs))

    def __contains__(self, position: object) -> bool:
        if not isinstance(position, int):
            return False
        if position < self.mark:
            return True
        i = bisect.bisect_right(self.runs, (position, float("inf"))) - 1
        return i >= 0 and self.runs[i][0] <= position <= self.runs[i][1]

    @staticmethod
    def parse(mark: int, above: Any) -> Takes:
        """``above`` as committed: spans ``[a, b]`` (or single positions, as the first version wrote them)."""
        runs = [(int(x), int(x)) if isinstance(x, int) else (int(x[0]), int(x[1])) for x in above or []]
        return Takes(mark, tuple(runs))


def runs_of(taken: list[int], letters: list[int]) -> list[list[int]]:
    """``taken`` (positions of letters, sorted) as spans of letters taken one after another among ``letters``
    (every letter's position in the partition, sorted): a span ends at a letter not taken."""
    chosen = set(taken)
    out: list[list[Any]] = []
    for position in letters:
        if position in chosen:
            if out and out[-1][2]:
                out[-1][1] = position
            else:
                out.append([position, position, True])
        elif out:
            out[-1][2] = False
    return [[a, b] for a, b, _ in out]


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
        self.fail_on_data_loss = parse_bool(opts, "failOnDataLoss", default="true")
        self.metadata_timeout_s = parse_int(opts, "metadataTimeoutMs", minimum=1, default="30000") / 1000
        self.poll_timeout_s = parse_int(opts, "kafkaConsumer.pollTimeoutMs", minimum=1, default="120000") / 1000
        self.consumer_conf = {k[len("kafka."):]: v for k, v in opts.items()
                              if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
        self._acknowledge: dict[str, str] | None = None
        if not any(SECRET_KEY.search(k) for k in self.consumer_conf):
            self._acknowledge = {"source": "deadLetters", "topic": self.topic,
                                 **{k: v for k, v in opts.items() if k.startswith("kafka.")},
                                 **{k: v for k, v in options.items() if k.lower() in (
                                     "replaygroup", "metadatatimeoutms", "kafkaconsumer.polltimeoutms",
                                     "failondataloss")}}
        self._store: Store | None = None
        self._log: SourceLog | None = None
        self._state: dict[str, Any] | None = None  # from, above (skipped), versions: as kept in the store
        self._letters: list[Letter] = []  # every letter read from the topic, in the order read
        self._next: dict[int, int] = {}  # each partition's next position to read into the index
        self._committed: dict[str, int] = {}  # each region's committed offset as of epoch _committed_epoch's record
        self._committed_epoch: int | None = None
        self._split_ends: dict[int, int] | None = None  # the topic's ends kept for the epoch being split
        self._split_records: dict[str, list[tuple[int, list[Letter]]]] | None = None
        self._bounds: dict[int, tuple[int, int]] = {}  # each partition's log start and end, as last read
        self._taken: dict[int, Takes] = {}  # the replay group's marks, as last read
        self._record: EpochRecord | None = None  # the last record heard of
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
        state.update(_store=None, _log=None, _state=None, _letters=[], _next={}, _committed={}, _split_ends=None,
                     _split_records=None, _bounds={}, _taken={}, _record=None)
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
            self._bounds = {}
            if meta is None or meta.error is not None or not meta.partitions:
                return []
            todo: dict[int, int] = {}
            for p in sorted(meta.partitions):
                low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                           timeout=self.metadata_timeout_s)
                self._bounds[p] = (low, high)
                start = self._next.get(p, low)
                if start < low:  # deleted before this replay read them: letters, or only aborted records
                    self._lost(p, start, low, "were deleted before this replay read them (they may have held "
                                              "letters, or only an aborted transaction's records)")
                    start = low
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
                    letter = Letter(p, position, region.decode(), int(offset),
                                    hash((m.key(), m.value(), headers.get(HEADER + "row"))))
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
        """What this replay keeps in its store: where it began in each partition (``from``: the group's marks
        when it first started), the letters other replays took (``above``, per partition), the records it
        dead-lettered again (``again``, per region: its probes never read them), and per planned epoch (the last
        few) the topic's ``ends`` its tasks read below and the first letters it then still owed (``owed``: position,
        region, offset; ``complete`` when that is all of them)."""
        if self._state is None:
            assert self._log is not None, "use_store() first"
            loaded = self._log.load()
            if loaded:
                self._state = loaded[0]
            else:
                taken = self._group_takes(first=True)
                self._state = {"from": {str(p): t.mark for p, t in taken.items()},
                               "above": {str(p): self._taken_positions(p, t) for p, t in taken.items()},
                               "again": {}, "versions": {}}
                self._log.write_snapshot(self._state)
        return self._state

    def _taken_positions(self, partition: int, takes: Takes) -> list[int]:
        return sorted(letter.position for letter in self._letters
                      if letter.partition == partition and letter.position >= takes.mark and letter.position in takes)

    def _group_takes(self, first: bool = False) -> dict[int, Takes]:
        """``replayGroup``'s marks per partition (``first``: as a new replay finds them, where it begins)."""
        from confluent_kafka import TopicPartition

        partitions = sorted({letter.partition for letter in self._letters} | set(self._next) | set(self._bounds))
        if not partitions:
            return {}
        consumer = _consumer(self._conf(**{"group.id": self.group}))
        try:
            marks = committed(consumer, [TopicPartition(self.topic, p) for p in partitions], self.metadata_timeout_s)
        finally:
            consumer.close()
        mine = None if first or self._store is None else self._store.query_id()  # none yet: a new replay
        taken: dict[int, Takes] = {}
        for tp in marks:
            if tp.offset < 0:
                continue
            meta = _mark(tp.metadata)
            if meta.get("above") is None and meta.get("whole") is False and meta.get("replayed_by") != mine:
                raise RegionalStoreError(
                    f"source=deadLetters: replay {meta.get('replayed_by')!r} took letters of {self.topic} partition "
                    f"{tp.partition} beyond its mark (position {tp.offset}), too many to name in group {self.group!r}: "
                    "this replay would read them again. Let that replay go on from its own checkpointLocation, or "
                    "give this one another replayGroup after deciding what it may read")
            taken[tp.partition] = Takes.parse(tp.offset, meta.get("above"))
        return taken

    def _records(self, ends: Mapping[int, int] | None = None) -> dict[tuple[str, int], list[Letter]]:
        """The letters from where this replay began, by record (region, offset): one record dead-lettered twice
        is one record with two letters (the first, by partition and position, is read). With ``ends``, only the
        letters below each partition's end then. Two different letters of one record fail the replay."""
        state = self._kept()
        began = {int(p): int(o) for p, o in state["from"].items()}
        out: dict[tuple[str, int], list[Letter]] = {}
        for letter in self._letters:
            if letter.position < began.get(letter.partition, 0):
                continue
            if ends is not None and letter.position >= ends.get(letter.partition, 0):
                continue
            copies = out.setdefault((letter.region, letter.offset), [])
            if copies and copies[0].digest != letter.digest:
                a, b = sorted([copies[0].at, letter.at])
                raise RegionalStoreError(
                    f"source=deadLetters: two different letters in {self.topic} are region {letter.region!r} offset "
                    f"{letter.offset} (partition {a[0]} position {a[1]}, partition {b[0]} position {b[1]}): two "
                    "queries of the same regions dead-letter to this topic. Replay them apart: give each query its "
                    "own deadLetterTopic")
            copies.append(letter)
        for copies in out.values():
            copies.sort(key=lambda c: c.at)
        return out

    def _other_replays(self, copies: list[Letter]) -> bool:
        """Whether another replay took this record (kept in the store once seen in the group)."""
        above = self._kept()["above"]
        return any(c.position in above.get(str(c.partition), ()) for c in copies)

    def _replayed(self, copies: list[Letter], committed: Mapping[str, int], seen: Mapping[int, int]) -> bool:
        """Whether a record was replayed: by another replay (``above``), by any replay as the group's marks say,
        or by this one (below its region's committed offset, and a letter of it was visible to the tasks that
        moved the region past it: ``seen``, the ends kept for that epoch)."""
        if self._other_replays(copies) or any(c.position in self._taken.get(c.partition, Takes()) for c in copies):
            return True
        return copies[0].offset < committed.get(copies[0].region, 0) and any(
            c.position < seen.get(c.partition, 0) for c in copies)

    def _progress(self, records: dict[tuple[str, int], list[Letter]], committed: Mapping[str, int],
                  seen: Mapping[int, int]) -> dict[int, tuple[int, list[int], list[list[Any]]]]:
        """Per partition: the position of its first letter not replayed (the end when there is none), the
        positions after it of letters replayed, and the first letters owed (position, region, offset)."""
        replayed: dict[int, list[int]] = {}
        owed: dict[int, list[list[Any]]] = {}
        for copies in records.values():
            done = self._replayed(copies, committed, seen)
            for c in copies:
                if done:
                    replayed.setdefault(c.partition, []).append(c.position)
                else:
                    owed.setdefault(c.partition, []).append([c.position, c.region, c.offset])
        out = {}
        for p in sorted(set(replayed) | set(owed) | set(self._next)):
            first_owed = sorted(owed.get(p, []))
            mark = first_owed[0][0] if first_owed else self._next.get(p, 0)
            out[p] = (mark, sorted(o for o in replayed.get(p, []) if o > mark), first_owed[:OWED_KEPT])
        return out

    def _losses(self, version: Mapping[str, Any] | None, committed: Mapping[str, int],
                seen: Mapping[int, int]) -> dict[int, tuple[int, str]]:
        """Per partition whose log start passed letters this replay still owed (as of ``committed``, by what
        ``version`` kept): the first such position, and what happened. A topic created again raises."""
        state = self._kept()
        at = {letter.at: letter for letter in self._letters}
        out: dict[int, tuple[int, str]] = {}
        partitions = version["ends"] if version else state["from"]
        for key in partitions:
            p = int(key)
            low, high = self._bounds.get(p, (None, None))
            ends = int(version["ends"][key]) if version else int(state["from"][key])
            if low is None or high is None or high < ends:
                raise RegionalStoreError(
                    f"source=deadLetters: {self.topic} partition {p} ends before the letters this replay read "
                    "(the topic was created again, or lost partitions): replay it with a new checkpointLocation")
            owed = version["owed"].get(key, []) if version else []
            for position, region, offset in owed:
                if position >= low:  # still there: it must still be that letter
                    letter = at.get((p, position))
                    if letter is None or (letter.region, letter.offset) != (region, offset):
                        raise RegionalStoreError(
                            f"source=deadLetters: {self.topic} partition {p} position {position} no longer holds the "
                            f"letter of region {region!r} offset {offset} this replay found there: the topic was "
                            "created again. Replay it with a new checkpointLocation")
                    break
                if not (offset < committed.get(region, 0) and position < seen.get(p, 0)) and position not in \
                        self._taken.get(p, Takes()):
                    out[p] = (position, f"held region {region!r} offset {offset}, not yet replayed")
                    break
            else:
                complete = version["complete"].get(key, True) if version else True
                last = owed[-1][0] if owed else None
                if not complete and last is not None and low > last:
                    out[p] = (last + 1, "held letters this replay still owed (more than it keeps a note of)")
                elif low > ends and (version is not None or p not in self._taken or low > self._taken[p].mark):
                    out[p] = (ends, "held letters or an aborted transaction's records this replay never read")
        return out

    def _lost(self, partition: int, position: int, low: int, what: str) -> None:
        """Letters of ``partition`` from ``position`` are gone (the log starts at ``low``): fail, or warn with
        failOnDataLoss=false."""
        message = (f"source=deadLetters: positions {position} to {low - 1} of {self.topic} partition {partition} "
                   f"{what}, and the topic's retention deleted them")
        if self.fail_on_data_loss:
            raise RegionalDataLossError(message + ": they were never replayed. Restore them and start again, or set "
                                        "failOnDataLoss=false to go on without them")
        log.warning("regional: %s; going on without them (failOnDataLoss=false)", message)

    # -- planning, on the driver -------------------------------------------------------------------

    def available(self, epoch: int) -> dict[str, int]:
        """The ends of the letters no replay took, by original region; what the epoch's tasks may read (the
        topic's ends now) and the letters still owed are kept in the store before this returns."""
        self._read_topic()
        state = self._kept()
        self._taken = self._group_takes()
        seen = self._ends_of(self._committed_epoch, exact=False) or {}
        versions = state["versions"]
        last = versions[max(versions, key=int)] if versions else None
        for p, (position, what) in self._losses(last, self._committed, seen).items():
            self._lost(p, position, self._bounds[p][0], what)
        records = self._records()  # once per plan: each step below walks them
        changed = self._note_other_replays(state, records)
        ends: dict[str, int] = {}
        late: list[tuple[str, int]] = []
        for (region, offset), copies in records.items():
            if self._replayed(copies, self._committed, seen):
                continue
            if offset < self._committed.get(region, 0):  # past it, and no letter of it was there to read
                late.append((region, offset))
            ends[region] = max(ends.get(region, 0), offset + 1)
        if late:
            region, offset = min(late)
            raise RegionalStoreError(
                f"source=deadLetters: {len(late)} letter(s) reached {self.topic} after this replay had passed their "
                f"offsets (e.g. region {region!r} at offset {offset}, below its committed offset "
                f"{self._committed[region]}): two queries share the topic, or its query started again from earlier "
                "offsets. This replay would never read them: replay them with a new checkpointLocation (it takes only "
                "letters no replay has marked in replayGroup)")
        progress = self._progress(records, self._committed, seen)
        version = {"ends": {str(p): o for p, o in self._next.items()},
                   "owed": {str(p): owed for p, (_, _, owed) in progress.items() if owed},
                   "complete": {str(p): len(owed) < OWED_KEPT for p, (_, _, owed) in progress.items() if owed}}
        if changed or versions.get(str(epoch)) != version:  # durable before Spark logs a plan made from it
            versions[str(epoch)] = version
            for old in sorted(versions, key=int)[:-KEPT_VERSIONS]:
                del versions[old]
            assert self._log is not None
            self._log.write_snapshot(state)
        return ends

    def _note_other_replays(self, state: dict[str, Any], records: dict[tuple[str, int], list[Letter]]) -> bool:
        """Keep in the store the letters the group says were taken that this replay did not take (another
        replay's: above this one's committed offsets), and the records this replay dead-lettered again as of its
        last record: the group's detail may be lost later (its metadata cut), the records' are far away."""
        changed = False
        for copies in records.values():
            first = copies[0]
            if first.offset < self._committed.get(first.region, 0) or self._other_replays(copies):
                continue
            if any(c.position in self._taken.get(c.partition, Takes()) for c in copies):
                for c in copies:
                    state["above"].setdefault(str(c.partition), []).append(c.position)
                changed = True
        record = self._record
        if record is not None:
            for region, letter in record.dead_lettered.items():
                again = state["again"].setdefault(region, [])
                if letter.offset not in again:
                    again.append(letter.offset)
                    changed = True
        return changed

    def before_splits(self, epoch: int) -> None:
        """The epoch's tasks read the letters below the topic's ends kept when it was planned (``available``): a
        re-run reads the same letters, and the marks cover what it read."""
        state = self._kept()
        kept = state["versions"].get(str(epoch))
        if kept is None:
            raise RegionalStoreError(f"source=deadLetters: the regional store keeps no topic ends for epoch {epoch}, "
                                     "which Spark planned: the store was changed or restored. Replay with a new "
                                     "checkpointLocation")
        if not self._letters:
            self._read_topic()
        if self._committed_epoch is None and self._store is not None:  # a restart's re-run of a logged plan
            record = self._store.latest_record()
            if record is not None:
                self._hear(record)
        self._taken = self._group_takes()
        self._split_ends = {int(p): int(o) for p, o in kept["ends"].items()}
        self._split_records = None  # built by the epoch's first split, once for all its regions

    def _ends_of(self, epoch: int | None, exact: bool = True) -> dict[int, int] | None:
        """The topic's ends kept for ``epoch`` (what its tasks could read); None if not kept. Not ``exact``: those
        of the newest epoch kept up to ``epoch`` (fewer letters seen: a late letter is never taken as read)."""
        versions = self._kept()["versions"]
        kept = None if epoch is None else versions.get(str(epoch))
        if kept is None and not exact and epoch is not None:
            older = [int(e) for e in versions if int(e) <= epoch]
            kept = versions[str(max(older))] if older else None
        return None if kept is None else {int(p): int(o) for p, o in kept["ends"].items()}

    def split(self, region: str, start: int, end: int) -> TopicSplit:
        ends = self._split_ends
        if ends is None:
            raise RegionalStoreError("source=deadLetters: split() before before_splits(): a reader bug")
        if self._split_records is None:  # every region's records below the epoch's ends, in offset order
            by_region: dict[str, list[tuple[int, list[Letter]]]] = {}
            for (r, offset), copies in self._records(ends).items():
                by_region.setdefault(r, []).append((offset, copies))
            self._split_records = {r: sorted(rs, key=lambda x: x[0]) for r, rs in by_region.items()}
        records = self._split_records.get(region, [])
        again = set(self._kept()["again"].get(region, ()))
        committed = self._committed.get(region, 0)
        positions = []
        for offset, copies in records[bisect.bisect_left(records, start, key=lambda x: x[0]):]:
            if offset >= end:
                break
            if offset in again:
                continue  # this replay's own dead-lettered again: a probe would fail on them
            if self._other_replays(copies) or (offset >= committed and any(
                    c.position in self._taken.get(c.partition, Takes()) for c in copies)):
                continue  # another replay's (this one's own are below its committed offset: its probes read them)
            positions.append(copies[0].at)
        return TopicSplit(tuple(positions))

    def on_recorded(self, record: EpochRecord) -> None:
        """Mark in ``replayGroup`` what was replayed, as of ``record``, by this replay and by any other as the
        group says: each partition's first letter not replayed, and the letters beyond it that were. A mark never
        passes a letter deleted before it was replayed (the next plan fails on it)."""
        from confluent_kafka import TopicPartition

        self._hear(record)
        if not self._letters:
            self._read_topic()
        # Replayed by this one: below its region's committed offset and visible to the epoch's tasks (a late
        # letter, past the ends kept for the epoch, was never read: the next plan fails on it, and it stays unmarked).
        seen = self._ends_of(record.epoch)
        if seen is None:  # not kept (an old epoch heard late): the next epoch's marks cover it
            log.info("regional: source=deadLetters: no topic ends kept for epoch %d; its marks wait for the next",
                     record.epoch)
            return
        self._taken = self._group_takes()  # another replay's marks since: kept, never overwritten
        lost = self._losses(self._kept()["versions"].get(str(record.epoch)), self._committed, seen)
        positions: dict[int, list[int]] = {}
        for letter in self._letters:
            positions.setdefault(letter.partition, []).append(letter.position)
        marks = []
        for p, (mark, above, _) in self._progress(self._records(), self._committed, seen).items():
            if p in lost and lost[p][0] < mark:  # every letter between stays marked replayed
                mark, above = lost[p][0], sorted(o for o in positions.get(p, []) if lost[p][0] < o < mark) + above
            meta = {"replayed_by": self._query_id(), "epoch": record.epoch,
                    "above": runs_of(above, sorted(o for o in positions.get(p, []) if o > mark))}
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

    def _hear(self, record: EpochRecord) -> None:
        """Where each region is as of ``record``: what a plan, a split and the marks go by."""
        self._committed = {r: s.committed_offset for r, s in record.regions.items()}
        self._committed_epoch, self._record = record.epoch, record

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
            raw["value"] = m.value()
            if "key" in letter_schema.names:
                raw["key"] = m.key()
            if "headers" in letter_schema.names:
                own = headers.get(HEADER + "source.headers", b"null")
                raw["headers"] = None if own == b"null" else [{"key": k, "value": v} for k, v in pairs[:int(own)]]
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
    taken = source._group_takes(first=True)
    for letter, epoch, error in seen:
        out.add(letter.region, letter.offset, epoch, error, letter.position in taken.get(letter.partition, Takes()))
    return out


def _typed(value: Any, kind: pa.DataType) -> Any:
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
