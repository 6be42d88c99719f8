"""Which letters of a dead-letter topic were replayed (the marks), kept where they cannot expire.

A partition's marks: ``offset``, its first letter not replayed (every letter below it was), ``above``, the spans
of letters beyond it already replayed, and ``replayed_by`` and ``epoch``, the replay and epoch that wrote them.

- Kept in a compacted topic, ``replayMarksTopic`` (default ``regional-replayed-<topic>``, created with
  ``cleanup.policy=compact`` as Kafka Connect keeps its source offsets in ``offset.storage.topic``): one record
  per partition of the dead-letter topic, keyed by it. Compaction keeps each key's last record, and neither
  time nor size retention applies, so the marks last as long as the topic. A marks topic whose cleanup.policy
  would delete records is refused.
- The consumer group ``replayGroup`` holds the same marks as committed offsets, the view Kafka's tools show
  (``kafka-consumer-groups --describe``). It is written in the same transaction as the topic, but its offsets
  expire (the brokers' ``offsets.retention.minutes``, 7 days after the group goes empty by default), so it is
  read only for a partition the topic has no marks of: marks a regional before the marks topic kept there.
  Those are read once and carried over into the topic.
- Every write is one transaction of the transactional id ``regional-replay-marks-<marks topic>``. Its
  ``init_transactions`` fences any other writer of these marks (another replay's, or this replay's other
  process) and waits for the transaction before it to be complete, so the marks read after it are the latest,
  and ``compute`` makes the new marks from them: two replays marking at once never overwrite each other's
  marks (the one fenced starts again, and reads the other's).
"""

from __future__ import annotations

import bisect
import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from regional.errors import RegionalConfigError, RegionalStoreError
from regional.inputs.deadletter_topic.letters import consumer, read_to_end
from regional.inputs.kafka import KafkaError, client_log
from regional.kafka_group import committed

log = logging.getLogger("regional.kafka")

MAX_GROUP_METADATA = 3500  # bytes of a partition's mark in the group (offset.metadata.max.bytes is 4096 by default)
MAX_TOPIC_MARK = 900_000  # bytes of a partition's mark in the marks topic (message.max.bytes is 1 MB by default)
WRITE_TRIES = 6  # a write fenced by another writer, or whose transaction failed, starts again
# Consumer-only settings regional adds itself: not given to the marks' producer and admin client.
CONSUMER_ONLY = ("group.id", "enable.auto.commit", "isolation.level", "fetch.wait.max.ms", "enable.partition.eof",
                 "auto.offset.reset")


@dataclass(frozen=True)
class Mark:
    """One partition's marks: every letter below ``offset`` was replayed, and those ``meta["above"]`` names."""

    partition: int
    offset: int
    meta: dict[str, Any]  # replayed_by, epoch, above (spans [a, b]; None, with whole False: too many to name)


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


def parse_meta(metadata: str | bytes | None) -> dict[str, Any]:
    try:
        value = json.loads(metadata or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _text(meta: Mapping[str, Any], limit: int) -> str:
    """``meta`` as JSON, or without its spans (``whole`` false) when longer than ``limit``."""
    text = json.dumps(meta, separators=(",", ":"))
    if len(text) > limit:
        text = json.dumps({"replayed_by": meta.get("replayed_by"), "epoch": meta.get("epoch"), "above": None,
                           "whole": False}, separators=(",", ":"))
    return text


class MarksStore:
    """The marks of the dead-letter topic ``topic``: in the compacted topic ``marks_topic``, viewed in ``group``.
    ``conf``: the consumers' settings (brokers, security: the replay's ``kafka.*``)."""

    def __init__(self, topic: str, group: str, marks_topic: str, conf: Mapping[str, Any], timeout_s: float) -> None:
        self.topic, self.group, self.marks_topic, self.timeout_s = topic, group, marks_topic, timeout_s
        self.conf = dict(conf)
        self._values: dict[int, Mark] = {}  # the marks topic's last record per partition, as read so far
        self._next: dict[int, int] = {}  # per partition of the marks topic: the next position to read
        self._checked = False  # the marks topic's cleanup.policy was checked

    def key(self, partition: int) -> bytes:
        # One byte string per partition (compaction keeps the last record of each key): sorted, no spaces.
        return json.dumps({"partition": partition, "topic": self.topic}, sort_keys=True,
                          separators=(",", ":")).encode()

    # -- reading ---------------------------------------------------------------------------------

    def read(self, partitions: Iterable[int], carry: bool = True) -> dict[int, Mark]:
        """Each partition's marks: the marks topic's; for one it has none of, the group's (a regional before the
        marks topic kept them there), carried over into the topic when ``carry``."""
        wanted = sorted(set(partitions))
        marks = self._read_topic()
        missing = [p for p in wanted if p not in marks]
        older = self._read_group(missing) if missing else {}
        if older and carry:
            self.write(lambda current: [m for p, m in older.items() if p not in current], carried=True)
            marks = self._read_topic()
        return {**older, **marks}

    def _read_group(self, partitions: list[int]) -> dict[int, Mark]:
        from confluent_kafka import TopicPartition

        reader = consumer({**self.conf, "group.id": self.group, "enable.auto.commit": False, "logger": client_log})
        try:
            found = committed(reader, [TopicPartition(self.topic, p) for p in partitions], self.timeout_s)
        finally:
            reader.close()
        return {tp.partition: Mark(tp.partition, tp.offset, parse_meta(tp.metadata)) for tp in found if tp.offset >= 0}

    def _read_topic(self) -> dict[int, Mark]:
        """The marks topic from where this store last read it to its end (read_committed): each partition's last
        marks. Nothing when the topic does not exist (yet)."""
        from confluent_kafka import TopicPartition

        reader = consumer({**self.conf, "group.id": self.group, "enable.auto.commit": False,
                           "isolation.level": "read_committed", "enable.partition.eof": True,
                           "auto.offset.reset": "earliest", "logger": client_log})
        try:
            meta = reader.list_topics(self.marks_topic, timeout=self.timeout_s).topics.get(self.marks_topic)
            if meta is None or meta.error is not None or not meta.partitions:
                if self._values:
                    raise RegionalStoreError(
                        f"source=deadLetters: the replay marks topic {self.marks_topic} is gone: it said which "
                        f"letters of {self.topic} were replayed, and without it a replay takes them again. Restore "
                        "it, or stop: a new replay of this topic would double what was replayed")
                return {}
            self._check_policy()
            todo: dict[int, int] = {}
            for p in sorted(meta.partitions):
                low, high = reader.get_watermark_offsets(TopicPartition(self.marks_topic, p), timeout=self.timeout_s)
                start = max(self._next.get(p, low), low)
                if start > high:  # the marks topic was created again: read it all again
                    self._values, self._next = {}, {}
                    return self._read_topic()
                if start < high:
                    todo[p] = start
            if not todo:
                return dict(self._values)

            def at_end(p: int, position: int) -> None:
                self._next[p] = max(self._next.get(p, 0), position)

            named = f"the marks topic {self.marks_topic}"
            for m in read_to_end(reader, self.marks_topic, todo, self.timeout_s, named, at_end):
                self._next[m.partition()] = m.offset() + 1
                self._take(m.key(), m.value())
        finally:
            reader.close()
        return dict(self._values)

    def _take(self, key: bytes | None, value: bytes | None) -> None:
        found = parse_meta(key)
        if found.get("topic") != self.topic or not isinstance(found.get("partition"), int):
            return  # another dead-letter topic's marks (a marks topic shared on purpose)
        partition = int(found["partition"])
        if value is None:  # a tombstone: someone removed the marks by hand
            self._values.pop(partition, None)
            return
        meta = parse_meta(value)
        offset = meta.pop("offset", None)
        if isinstance(offset, int):
            self._values[partition] = Mark(partition, offset, meta)

    def _check_policy(self) -> None:
        """The marks topic must keep its records: ``compact`` alone (``delete`` would let retention take marks)."""
        if self._checked:
            return
        from confluent_kafka.admin import ConfigResource, ResourceType

        resource = ConfigResource(ResourceType.TOPIC, self.marks_topic)
        admin = self._admin()  # kept while its future runs: a client collected never answers
        try:
            configs = admin.describe_configs([resource], request_timeout=self.timeout_s)[resource].result(
                self.timeout_s)
        except Exception as exc:
            raise KafkaError(f"source=deadLetters: could not read the replay marks topic {self.marks_topic}'s "
                             f"cleanup.policy ({exc}); is the broker up, and may this principal describe its "
                             "configs?") from None
        entry = configs.get("cleanup.policy")
        policy = entry.value if entry is not None else ""
        if {p.strip() for p in (policy or "").split(",")} != {"compact"}:
            raise RegionalConfigError(
                f"source=deadLetters: the replay marks topic {self.marks_topic} has cleanup.policy={policy}: "
                "retention would delete its records, and a replay after that would take every letter again. Set "
                f"cleanup.policy=compact on it (kafka-configs --alter --entity-type topics --entity-name "
                f"{self.marks_topic} --add-config cleanup.policy=compact), or name another with replayMarksTopic")
        self._checked = True

    # -- writing ---------------------------------------------------------------------------------

    def write(self, compute: Callable[[dict[int, Mark]], list[Mark] | None], carried: bool = False) -> list[Mark]:
        """In one transaction that fences every other writer: the marks ``compute`` makes of the latest ones
        (None or []: nothing to write), to the marks topic and (unless ``carried`` from it) the group. Returns
        what was written."""
        from confluent_kafka import KafkaException, Producer, TopicPartition

        self._ensure_topic()
        for attempt in range(WRITE_TRIES):
            fatal: list[str] = []  # a fenced producer's fatal error, noted (raised from a callback it is garbled)
            producer = Producer({**{k: v for k, v in self.conf.items() if k not in CONSUMER_ONLY},
                                 "transactional.id": f"regional-replay-marks-{self.marks_topic}",
                                 "enable.idempotence": True, "logger": client_log,
                                 "error_cb": _noting_error(fatal)})
            group = None
            try:
                producer.init_transactions(self.timeout_s)  # fences other writers; the one before is complete
                marks = compute(self._read_topic())
                if not marks:
                    return []
                producer.begin_transaction()
                failed: list[str] = []
                for m in marks:
                    producer.produce(self.marks_topic, key=self.key(m.partition),
                                     value=_text({"offset": m.offset, **m.meta}, MAX_TOPIC_MARK).encode(),
                                     on_delivery=_noting(failed))
                producer.flush(self.timeout_s)
                if failed or fatal:
                    raise KafkaError(f"the marks topic refused them: {(failed + fatal)[0]}")
                if not carried:  # the view, in the same transaction
                    group = consumer({**self.conf, "group.id": self.group, "enable.auto.commit": False,
                                      "logger": client_log})
                    offsets = [TopicPartition(self.topic, m.partition, m.offset,
                                              metadata=_text(m.meta, MAX_GROUP_METADATA)) for m in marks]
                    producer.send_offsets_to_transaction(offsets, group.consumer_group_metadata(), self.timeout_s)
                producer.commit_transaction(self.timeout_s)
                for m in marks:  # ours now; a reader goes on from where it read
                    self._values[m.partition] = Mark(m.partition, m.offset, dict(m.meta))
                return marks
            except (KafkaException, KafkaError, BufferError, SystemError) as exc:  # SystemError: see ``fatal``
                _abort_quietly(producer)
                if attempt == WRITE_TRIES - 1:
                    raise KafkaError(f"source=deadLetters: could not write the replay marks of {self.topic} to "
                                     f"{self.marks_topic} ({exc}): is the broker up, and may this principal "
                                     "write that topic with transactions?") from None
                log.info("regional: writing the replay marks of %s again (%s)", self.topic, exc)
                time.sleep(random.uniform(0.1, 0.3) * (attempt + 1))  # another writer fenced this one
            finally:
                if group is not None:
                    group.close()
        return []  # not reached

    def _ensure_topic(self) -> None:
        """Create the marks topic if it is missing: compacted, one partition, the brokers' replication."""
        from confluent_kafka import KafkaError as RdKafkaError
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewTopic

        if self._checked:  # it exists, compacted
            return
        admin = self._admin()
        found = admin.list_topics(self.marks_topic, timeout=self.timeout_s).topics.get(self.marks_topic)
        if found is None or found.error is not None:
            future = admin.create_topics([NewTopic(self.marks_topic, 1, -1, config={"cleanup.policy": "compact"})],
                                         operation_timeout=self.timeout_s)[self.marks_topic]
            try:
                future.result(self.timeout_s)
                log.warning("regional: created the replay marks topic %s (cleanup.policy=compact)", self.marks_topic)
                self._checked = True  # as created (its configs may not be described for a moment yet)
                return
            except KafkaException as exc:
                if not (exc.args and exc.args[0].code() == RdKafkaError.TOPIC_ALREADY_EXISTS):
                    raise KafkaError(f"source=deadLetters: the replay marks topic {self.marks_topic} does not exist "
                                     f"and could not be created ({exc}): create it with cleanup.policy=compact, or "
                                     "let this principal create topics") from None
        self._check_policy()

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        conf: dict[str, Any] = {k: v for k, v in self.conf.items() if k not in CONSUMER_ONLY}
        conf["logger"] = client_log
        return AdminClient(conf)


def _noting(failed: list[str]) -> Callable[[Any, Any], None]:
    """A delivery callback that notes each failure in ``failed``."""
    def note(err: Any, _msg: Any) -> None:
        if err:
            failed.append(str(err))
    return note


def _noting_error(errors: list[str]) -> Callable[[Any], None]:
    """An error callback that notes each fatal error in ``errors`` (others librdkafka retries itself)."""
    def note(err: Any) -> None:
        if getattr(err, "fatal", lambda: False)():
            errors.append(str(err))
    return note


def _abort_quietly(producer: Any) -> None:
    try:
        producer.abort_transaction(5)
    except Exception:  # not in a transaction, fenced, or the brokers are gone: the next init_transactions settles it
        pass
