"""A consumer group's committed offsets, asked of a group coordinator that may still be starting: shared by the
dead-letter topic's marker (``targets.kafka_topic``) and the replay's marks (``inputs.deadletter_topic``)."""

from __future__ import annotations

import time
from typing import Any

# A coordinator that is moving or loading answers these for a while (the first group query after a broker's start
# gets NOT_COORDINATOR; measured): asked again until the timeout.
RETRIABLE_GROUP_ERRORS = ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE",
                          "UNSTABLE_OFFSET_COMMIT", "_TIMED_OUT", "_TRANSPORT")


def committed(consumer: Any, partitions: list[Any], timeout_s: float) -> list[Any]:
    """``consumer``'s group's committed offsets (with their metadata) of ``partitions`` (``TopicPartition``)."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return list(consumer.committed(partitions, timeout=max(deadline - time.monotonic(), 1)))
        except KafkaException as exc:
            name = exc.args[0].name() if exc.args and hasattr(exc.args[0], "name") else ""
            if name not in RETRIABLE_GROUP_ERRORS or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
