"""The options of ``source=deadLetters`` with ``topic`` (``DeadLetterTopicInput.OPTIONS``)."""

from __future__ import annotations

from regional.options import Option, OptionTable

_STARTS = "a replay takes every letter no replay has marked, up to the topic's end when each epoch is planned"
TOPIC_OPTIONS = OptionTable("source=deadLetters (a dead-letter topic)", [
    Option("topic", "required", "The dead-letter topic to replay: the `deadLetterTopic` of the query whose dead "
                                "letters to replay."),
    Option("kafka.bootstrap.servers", "required", "The dead-letter topic's brokers."),
    Option("kafka.", "", "Every librdkafka consumer setting (security, SASL, ...) by its name, as the Kafka source "
                         "takes them; the marks' producer uses them too. With a credential among them, only the "
                         "reader makes the marks (they never go into the plan).", prefix=True),
    Option("kafka.isolation.level", "read_committed", "Only `read_committed`: a letter of an aborted transaction was "
                                                      "never dead-lettered; another value is refused."),
    Option("kafka.group.id", "", "", refused="the group that shows the replay's marks is `replayGroup`"),
    Option("kafka.enable.auto.commit", "", "", refused="the marks are written after each recorded epoch"),
    Option("kafka.auto.offset.reset", "", "", refused=_STARTS),
    Option("replayGroup", "regional-replayed-<topic>", "The consumer group that shows which letters were replayed "
                                                       "(`kafka-consumer-groups --describe`), written with the marks."),
    Option("replayMarksTopic", "the replayGroup's name", "The compacted topic that keeps the marks (which letters "
                                                         "were replayed); created with `cleanup.policy=compact` when "
                                                         "missing. One with `delete` in its cleanup.policy is "
                                                         "refused: its marks would expire."),
    Option("failOnDataLoss", "true", "Letters deleted by retention before any replay took them fail the replay "
                                     "(false: go on with a warning), as on the Kafka source.", stock=True),
    Option("metadataTimeoutMs", "30000", "Each call to the brokers, in milliseconds."),
    Option("kafkaConsumer.pollTimeoutMs", "120000", "How long a task waits for a letter, in milliseconds.",
           stock=True),
    Option("subscribe", "", "", refused="a replay reads the one dead-letter topic named by `topic`", stock=True),
    Option("subscribePattern", "", "", refused="a replay reads the one dead-letter topic named by `topic`",
           stock=True),
    Option("assign", "", "", refused="a replay reads every partition of the topic named by `topic`", stock=True),
    Option("startingOffsets", "", "", refused=_STARTS, stock=True),
    Option("startingOffsetsByTimestamp", "", "", refused=_STARTS, stock=True),
    Option("startingTimestamp", "", "", refused=_STARTS, stock=True),
    Option("endingOffsets", "", "", refused=_STARTS, stock=True),
    Option("includeHeaders", "", "", refused="a Kafka record's own headers come back as its source read them (with "
                                             "includeHeaders on the query that dead-lettered it)", stock=True),
])
