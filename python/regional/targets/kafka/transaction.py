"""One epoch's records produced to Kafka exactly once: one transaction, with a commit marker inside it.

Shared by ``target=kafka`` and the dead-letter topic (``regional.targets.kafka_topic``). Kafka Streams' idea:

1. ``init_transactions`` under the query's transactional id. It fences every older producer of that id (a zombie
   driver of the same checkpoint: its next call fails, its open transaction never commits) and settles the
   transaction it left: aborted, unless it was already committing, when it completes.
2. The marker is read: the committed offset of the marker group (named after the query) on partition 0 of the
   marker topic, read stably (a pending transactional commit is waited for). Offset ``e + 1`` says epoch ``e``'s
   transaction committed. So a restart knows at once, without waiting for ``transaction.timeout.ms``: the epoch it
   finishes is produced again only if the marker does not cover it.
3. The epoch's records are produced in a new transaction, and the marker (``epoch + 1``) is committed *in the same
   transaction* (``send_offsets_to_transaction``): the records and the marker become visible together or never.

KIP-939 (a transaction prepared by one producer and committed by another: the tasks would produce, the driver
commit) is not in librdkafka; without it, the records must be produced by the producer that commits, on the driver.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from regional import failpoints
from regional.errors import RegionalError, RegionalStoreError
from regional.kafka_group import committed

log = logging.getLogger("regional.kafka")
client_log = logging.getLogger("regional.kafka.client")  # librdkafka's own lines: quiet (inputs.kafka sets it)
if client_log.level == logging.NOTSET:
    client_log.setLevel(logging.CRITICAL)

SIZE_TOO_LARGE = "SIZE_TOO_LARGE"

# Queues the epoch's records into the producer (``send``); returns how many. Delivery errors reach the transaction's
# own report (the producer reports failed deliveries only: a callback per record costs more than producing it).
Produce = Callable[[Any], int]


class EpochTransaction:
    """The transactional id, marker group and clients of one query's epochs into one Kafka place."""

    def __init__(self, transactional_id: str, settings: Mapping[str, Any], query_id: str, timeout_s: float,
                 failpoint: str) -> None:
        self.transactional_id = self.group = transactional_id
        self.failpoint = failpoint  # the crash tests' names of the steps: <failpoint>_produced, ...
        self.query_id = query_id
        self.timeout_s = timeout_s
        self._settings = dict(settings)  # may hold credentials: never logged, never stored

    def producer_conf(self, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {**self._settings, **(settings or {}), "transactional.id": self.transactional_id,
                "enable.idempotence": True, "logger": client_log}

    def consumer_conf(self) -> dict[str, Any]:
        # The producer's settings reach the brokers the same way (security, SASL); the producer-only ones are left
        # out (librdkafka would log that it ignores them).
        from regional.inputs.kafka.client_settings import PRODUCER_ONLY

        common = {k: v for k, v in self._settings.items() if k not in PRODUCER_ONLY and k != "message.max.bytes"}
        return {**common, "group.id": self.group, "enable.auto.commit": False, "isolation.level": "read_committed",
                "logger": client_log}

    def marked_epoch(self, consumer: Any, marker_topic: str) -> int | None:
        """The last epoch whose transaction committed into ``marker_topic`` (the marker group's offset - 1)."""
        from confluent_kafka import KafkaException, TopicPartition

        [tp] = committed(consumer, [TopicPartition(marker_topic, 0)], self.timeout_s)
        if tp.error is not None:
            raise KafkaException(tp.error)
        return tp.offset - 1 if tp.offset >= 0 else None

    def produce_once(self, epoch: int, marker_topic: str, where: str, produce: Produce,
                     before: Callable[[], None] | None = None, settings: Mapping[str, Any] | None = None) -> bool:
        """Steps 1 to 3 for ``epoch``: ``produce(producer)`` queues the records (``send``); ``before`` runs once the
        marker says they are not in yet. False when they were already (nothing produced). Raises KafkaException or
        BufferError from the brokers, after aborting what it began; ``RegionalStoreError`` when the marker is past
        ``epoch`` (the store is behind the topic). ``settings``: this epoch's producer settings over the query's."""
        from confluent_kafka import KafkaException, Producer, TopicPartition

        failures: list[str] = []

        def report(err: Any, _msg: Any) -> None:  # failed deliveries only (delivery.report.only.error)
            if err is not None and len(failures) < 10:
                failures.append(str(err))

        producer = consumer = None
        try:
            producer = Producer({**self.producer_conf(settings), "delivery.report.only.error": True,
                                 "on_delivery": report})
            producer.init_transactions(self.timeout_s)  # fences a zombie of this query; settles its transaction
            consumer = _consumer(self.consumer_conf())
            done = self.marked_epoch(consumer, marker_topic)
            if done is not None and done > epoch:  # the store is behind the topic: restored, or copied
                raise RegionalStoreError(
                    f"{where} already holds this query's records up to epoch {done}, but its store is at epoch "
                    f"{epoch}: the checkpoint was restored from a backup or copied (the copy has the same query id). "
                    "Its records would be skipped: start the query on a new checkpointLocation")
            if done == epoch:
                log.warning("regional: epoch %d is already in %s (marker of epoch %d): not produced again", epoch,
                            where, done)
                return False
            if before is not None:
                before()
            producer.begin_transaction()
            produce(producer)
            left = producer.flush(self.timeout_s)
            if left:
                failures.append(f"{left} record(s) not delivered within timeoutMs ({self.timeout_s:g} s)")
            if failures:
                raise KafkaException(failures[0])
            failpoints.reach(f"{self.failpoint}_produced", epoch)
            marker = TopicPartition(marker_topic, 0, epoch + 1,
                                    metadata=json.dumps({"epoch": epoch, "query": self.query_id}))
            producer.send_offsets_to_transaction([marker], consumer.consumer_group_metadata(), self.timeout_s)
            failpoints.reach(f"{self.failpoint}_before_commit", epoch)
            producer.commit_transaction(self.timeout_s)
            failpoints.reach(f"{self.failpoint}_committed", epoch)
            return True
        except (KafkaException, BufferError, RegionalError):
            _abort_quietly(producer)
            raise
        finally:
            if consumer is not None:
                consumer.close()
            # A failure's traceback keeps this frame: a producer left in it would live on, its timed-out
            # init_transactions still running, and fence the producer of the next attempt in this process.
            producer = consumer = None


def send(producer: Any, topic: str, value: bytes | None, key: bytes | None,
         headers: list[tuple[str, str | bytes | None]] | None, partition: int, timeout_s: float) -> None:
    """One record into ``producer``'s queue (``partition`` -1: the partitioner's choice); a full queue is drained
    (the producer's reports served) until it takes it, for at most ``timeout_s``."""
    try:
        producer.produce(topic, value, key, partition, headers=headers)
        return
    except BufferError:
        pass
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        producer.poll(0.05)
        try:
            producer.produce(topic, value, key, partition, headers=headers)
            return
        except BufferError:
            if time.monotonic() > deadline:
                raise


def failure_hint(text: str) -> str:
    """What to do about a failure the brokers reported, in a sentence."""
    if SIZE_TOO_LARGE in text or "TOO_LARGE" in text:
        return " A record is larger than the producer or topic takes: raise the topic's max.message.bytes."
    if "_FATAL" in text or "FENCED" in text.upper():  # librdkafka's fatal error of a transactional producer: fenced
        return (" The producer was fenced: either another run of this query (the same checkpointLocation) started, "
                "or producing the epoch took longer than kafka.transaction.timeout.ms (librdkafka's default 60000) "
                "and the broker aborted its transaction, which it would do again at every start: raise "
                "kafka.transaction.timeout.ms (the brokers cap it at transaction.max.timeout.ms, 15 minutes by "
                "default), or make epochs smaller (maxRecordsPerTrigger).")
    return " Check that the brokers are up and take this query's transactions."


def _consumer(conf: Mapping[str, Any]) -> Any:
    from confluent_kafka import Consumer

    return Consumer(dict(conf))


def _abort_quietly(producer: Any) -> None:
    """A failed transaction is aborted now if the producer still can; otherwise the next ``init_transactions``
    (or the broker's transaction timeout) aborts it."""
    if producer is None:
        return
    try:
        producer.abort_transaction(5)
    except Exception:  # not in a transaction, fenced, or the brokers are gone: the next start settles it
        pass
