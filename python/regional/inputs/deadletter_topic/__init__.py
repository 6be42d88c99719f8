"""``source=deadLetters``, ``topic=<dead-letter topic>``: replay the records a query dead-lettered to Kafka.

A query with ``deadLetterTopic`` produces each record isolated as poison to that topic (``regional.targets.
kafka_topic``), with headers that say where it came from (``regional.region``, ``regional.offset``) and what
it was (``regional.schema``; ``regional.row`` for a Kafka source's record). This source reads them back as
that source's records, as ``path=<dead-letter table>`` does for a table (``regional.inputs.deadletter_table``): the
same columns, regions and offsets (sparse), so the same select runs again into the same target.

Options (``OPTIONS`` in ``source``): ``topic``, ``kafka.bootstrap.servers`` and the consumer's ``kafka.*``
settings, by the Kafka source's rules (``kafka.group.id`` and ``kafka.isolation.level`` are regional's: letters
are read ``read_committed``, never one of an aborted transaction); ``replayGroup`` (default
``regional-replayed-<topic>``) and ``replayMarksTopic`` (default: the group's name); ``metadataTimeoutMs`` and
``kafkaConsumer.pollTimeoutMs`` as the Kafka source.

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
- Marks (``marks``): a topic's records cannot be changed, so "which letters were replayed" is kept apart: after
  each recorded epoch, per partition, its first letter not yet replayed (published or dead-lettered again) by
  this replay or any other, and the spans of letters beyond it already replayed (``above``), naming this query
  and the epoch. They are kept in the compacted topic ``replayMarksTopic``, where nothing expires, and
  committed in the same transaction to the consumer group ``replayGroup``, the view Kafka's tools show (its
  offsets expire: ``offsets.retention.minutes``; they are read only for marks a regional before the marks topic
  kept there, carried over once). Every plan reads the marks, and keeps in the store what another replay took:
  a replay never takes a letter another replay's marks hold, and a new replay (a new checkpointLocation) begins
  there. A write fences every other writer of the marks first, so two replays never overwrite each other's.
- A letter below where this replay already is (late), one deleted by the topic's retention before any replay
  took it, or a topic created again, fails the replay, saying so: absence is never success.

Modules: ``letters`` (a letter, a task's read), ``marks`` (the marks topic and group), ``options``, ``summary``
(the CLI's), ``source`` (the rest).

Where each method runs: the index, ``available``, ``before_splits``, ``split`` and ``on_recorded`` on the driver
(``on_recorded`` also in the sink's phase two when no ``kafka.*`` option is a credential: ``phase_two_options``);
``read`` in the task, with a consumer of its own that reads only the positions in its split.
"""

from regional.inputs.deadletter_topic.options import TOPIC_OPTIONS as OPTIONS
from regional.inputs.deadletter_topic.source import DeadLetterTopicInput
from regional.inputs.deadletter_topic.summary import topic_summary

__all__ = ["OPTIONS", "DeadLetterTopicInput", "topic_summary"]
