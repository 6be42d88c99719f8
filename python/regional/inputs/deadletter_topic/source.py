"""The dead-letter topic replay itself (``DeadLetterTopicInput``, ``topic_summary``): the index of letters, the
plans, the splits and the marks after each recorded epoch. The package's docstring says what it guarantees."""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from regional import failpoints
from regional.errors import RegionalConfigError, RegionalDataLossError, RegionalStoreError
from regional.inputs.base import BATCH_ROWS, AcknowledgingInput, RegionInput, StoredInput
from regional.inputs.deadletter_rows import plain_type, spark_ddl
from regional.inputs.deadletter_topic.letters import (
    HEADER,
    Letter,
    TopicSplit,
    consumer,
    headers_of,
    letter_schema,
    read_letters,
    read_to_end,
)
from regional.inputs.deadletter_topic.marks import Mark, MarksStore, Takes, runs_of
from regional.inputs.deadletter_topic.options import TOPIC_OPTIONS
from regional.inputs.kafka import FETCH_WAIT_MS, KafkaError, client_log
from regional.protocol.settings import parse_bool, parse_int
from regional.store.model import EpochRecord
from regional.targets import TOPIC_PLACE

if TYPE_CHECKING:
    from regional.store import Store
    from regional.store.source_log import SourceLog

log = logging.getLogger("regional.kafka")

KEPT_VERSIONS = 4  # the topic's ends of the last few epochs, kept in the store
TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
OWED_KEPT = 1000  # per partition, the first letters a replay owes, kept in the store (retention deletes the first)
# kafka.* keys that may hold a credential: the options that build this source in the sink's phase two go into the
# plan (Spark's offset log), so with one of these the marks are made by the reader only.
SECRET_KEY = re.compile(r"password|secret|jaas|token|keytab|oauthbearer|credential|key\.pem|private|\.key$")
REFUSED = {
    "kafka.group.id": "replayGroup (the group that keeps which letters were replayed)",
    "kafka.enable.auto.commit": "nothing (the marks are committed after each recorded epoch)",
    "kafka.auto.offset.reset": "nothing (a replay reads every letter no replay has taken)",
}



class DeadLetterTopicInput(RegionInput[TopicSplit], StoredInput, AcknowledgingInput):
    OPTIONS = TOPIC_OPTIONS  # what the reader checks a replay's options against (``options.declared_by``)
    schema: pa.Schema
    schema_ddl: str
    sparse = True

    def __init__(self, options: Mapping[str, str], read_letters: bool = True) -> None:
        """``read_letters`` False: no index and no schema yet (``topic_summary`` reads the letters itself)."""
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            raise RegionalConfigError("source=deadLetters with a topic needs confluent-kafka: pip install "
                                      "'pyspark-regional[kafka]'") from None
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
        # The marks' topic follows the group by default: another replayGroup is another set of marks.
        self.marks_topic = opts.get("replaymarkstopic", "").strip() or self.group
        if not TOPIC_NAME.match(self.marks_topic) or self.marks_topic in (".", "..", self.topic):
            raise RegionalConfigError(
                f"source=deadLetters: {self.marks_topic!r} cannot be the topic that keeps which letters of "
                f"{self.topic} were replayed (a topic name is at most 249 of a-z, A-Z, 0-9, '.', '_', '-', and not "
                "the dead-letter topic itself): name one with .option('replayMarksTopic', ...)")
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
                                     "replaygroup", "replaymarkstopic", "metadatatimeoutms",
                                     "kafkaconsumer.polltimeoutms", "failondataloss")}}
        self.marks = MarksStore(self.topic, self.group, self.marks_topic, self._conf(), self.metadata_timeout_s)
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
                     _split_records=None, _bounds={}, _taken={}, _record=None,
                     marks=None)
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
        from confluent_kafka import TopicPartition

        reader = consumer(self._conf(**{"group.id": self.group, "enable.partition.eof": True,
                                           "auto.offset.reset": "error"}))
        schemas: dict[bytes, pa.Schema] = {}
        try:
            meta = reader.list_topics(self.topic, timeout=self.metadata_timeout_s).topics.get(self.topic)
            self._bounds = {}
            if meta is None or meta.error is not None or not meta.partitions:
                return []
            todo: dict[int, int] = {}
            for p in sorted(meta.partitions):
                low, high = reader.get_watermark_offsets(TopicPartition(self.topic, p),
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

            def at_end(p: int, position: int) -> None:  # past the last letter: a later one is read by the next call
                self._next[p] = max(self._next[p], position)

            named = f"{self.topic} at {self.bootstrap}"
            for m in read_to_end(reader, self.topic, todo, self.metadata_timeout_s, named, at_end):
                p, position = m.partition(), m.offset()
                if position < self._next[p]:
                    continue
                headers = headers_of(m)
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
                    schemas[schema] = letter_schema(schema)
        finally:
            reader.close()
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

    def _partitions(self) -> list[int]:
        return sorted({letter.partition for letter in self._letters} | set(self._next) | set(self._bounds))

    def _group_takes(self, first: bool = False, carry: bool = True) -> dict[int, Takes]:
        """The marks per partition (``first``: as a new replay finds them, where it begins), as the marks topic
        keeps them (or the group, for marks a regional before the marks topic kept there: carried over into the
        topic when ``carry``)."""
        partitions = self._partitions()
        return self._takes_of(self.marks.read(partitions, carry=carry), first) if partitions else {}

    def _takes_of(self, marks: Mapping[int, Mark], first: bool = False) -> dict[int, Takes]:
        mine = None if first or self._store is None else self._store.query_id()  # none yet: a new replay
        taken: dict[int, Takes] = {}
        for p, mark in sorted(marks.items()):
            meta = mark.meta
            if meta.get("above") is None and meta.get("whole") is False and meta.get("replayed_by") != mine:
                raise RegionalStoreError(
                    f"source=deadLetters: replay {meta.get('replayed_by')!r} took letters of {self.topic} partition "
                    f"{p} beyond its mark (position {mark.offset}), too many to name in {self.marks.marks_topic}: "
                    "this replay would read them again. Let that replay go on from its own checkpointLocation, or "
                    "give this one another replayGroup and replayMarksTopic after deciding what it may read")
            taken[p] = Takes.parse(mark.offset, meta.get("above"))
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
                for offset in range(letter.offset, letter.offset + letter.count):
                    if offset not in again:
                        again.append(offset)
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
        """Mark what was replayed, as of ``record``, by this replay and by any other as the marks say: each
        partition's first letter not replayed, and the letters beyond it that were. A mark never passes a letter
        deleted before it was replayed (the next plan fails on it). The marks are computed in the write's
        transaction, from the marks as they are once every other writer is fenced: never overwritten."""
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
        partitions = self._partitions()
        before = self.marks.read(partitions) if partitions else {}  # a group's older marks: carried over first
        if partitions and all(p in before and before[p].meta.get("replayed_by") == self._query_id()
                              and int(before[p].meta.get("epoch", -1)) >= record.epoch for p in partitions):
            return  # marked already (the sink's phase two, then the reader hearing the same record)
        positions: dict[int, list[int]] = {}
        for letter in self._letters:
            positions.setdefault(letter.partition, []).append(letter.position)

        def compute(current: dict[int, Mark]) -> list[Mark] | None:
            latest = {**before, **current}
            if any(latest[p].meta.get("replayed_by") == self._query_id()
                   and int(latest[p].meta.get("epoch", -1)) > record.epoch for p in latest):
                return None  # a later epoch's marks are there already: never go back
            self._taken = self._takes_of(latest)  # another replay's marks since: kept, never overwritten
            lost = self._losses(self._kept()["versions"].get(str(record.epoch)), self._committed, seen)
            marks = []
            for p, (mark, above, _) in self._progress(self._records(), self._committed, seen).items():
                if p in lost and lost[p][0] < mark:  # every letter between stays marked replayed
                    mark, above = lost[p][0], sorted(o for o in positions.get(p, []) if lost[p][0] < o < mark) + above
                marks.append(Mark(p, mark, {"replayed_by": self._query_id(), "epoch": record.epoch,
                                            "above": runs_of(above, sorted(o for o in positions.get(p, [])
                                                                           if o > mark))}))
            return marks

        failpoints.reach("before_marks", record.epoch)
        try:
            self.marks.write(compute)
        except KafkaError as exc:
            raise KafkaError(f"{exc}. Epoch {record.epoch}'s letters are not marked replayed yet; the next start "
                             "marks them (start no other replay of this topic before)") from None

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

    # -- in the task -----------------------------------------------------------------------------

    def read(self, region: str, start: int, end: int, split: TopicSplit,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        rows = read_letters(self._conf(), self.topic, region, start, end, split, self.poll_timeout_s, self.schema)
        if rows:
            yield from pa.Table.from_pylist(rows, schema=self.schema).to_batches(max_chunksize=batch_rows)
