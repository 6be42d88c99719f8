"""Both dead-letter replays declare every option they read (``OPTIONS``, checked at start by the reader), each in
its own module: ``declared_by`` finds the table's for a table replay and the topic's for a topic replay."""

from __future__ import annotations

import pyarrow as pa
import pytest

from regional.dead_letters import dead_letter_rows, encode_records
from regional.errors import RegionalConfigError
from regional.inputs import load_input
from regional.inputs.deadletter_table import OPTIONS as TABLE_OPTIONS
from regional.inputs.deadletter_table import DeadLetterInput
from regional.inputs.deadletter_topic import OPTIONS as TOPIC_OPTIONS
from regional.inputs.deadletter_topic import DeadLetterTopicInput
from regional.options import SPARK_READ, check_given, declared_by
from regional.protocol.settings import SETTINGS_OPTIONS
from regional.spark.reader import READ_OPTIONS
from regional.targets import dead_letter_target


def tables(declared):
    return [declared, READ_OPTIONS, SETTINGS_OPTIONS, SPARK_READ]


def test_a_table_replay_declares_its_options(tmp_path):
    table = str(tmp_path / "dlq")
    batch = pa.RecordBatch.from_pydict({"region": ["a"], "offset": [3], "value": ["x"]},
                                       pa.schema([("region", pa.string()), ("offset", pa.int64()),
                                                  ("value", pa.string())]))
    rows = dead_letter_rows(encode_records([batch], batch.schema), "a", 3, 1, "ValueError: bad")
    sink = dead_letter_target(table, "original")
    sink.commit(1, {"a": sink.prepare(1, "a", iter(rows.to_batches()))})
    given = {"source": "deadLetters", "path": table, "checkpointLocation": str(tmp_path / "ck")}
    source = load_input(given)
    assert isinstance(source, DeadLetterInput) and declared_by(source) is TABLE_OPTIONS
    check_given("readStream", given, tables(TABLE_OPTIONS))
    with pytest.raises(RegionalConfigError, match="'startingVersion' is not supported by regional: a replay reads "
                                                  "every record of the table that no replay has marked"):
        check_given("readStream", {**given, "startingVersion": "3"}, tables(TABLE_OPTIONS))
    with pytest.raises(RegionalConfigError, match="'pth' is not an option"):
        check_given("readStream", {**given, "pth": table}, tables(TABLE_OPTIONS))


def test_a_topic_replay_declares_every_option_it_reads():
    given = {"source": "deadLetters", "topic": "orders.dead", "kafka.bootstrap.servers": "127.0.0.1:1",
             "kafka.security.protocol": "PLAINTEXT", "kafka.isolation.level": "read_committed",
             "replayGroup": "g", "replayMarksTopic": "g.marks", "failOnDataLoss": "false",
             "metadataTimeoutMs": "1000", "kafkaConsumer.pollTimeoutMs": "1000", "maxOffsetsPerTrigger": "5"}
    source = DeadLetterTopicInput(given, read_letters=False)  # no broker asked
    assert declared_by(source) is TOPIC_OPTIONS
    assert (source.group, source.marks_topic) == ("g", "g.marks")
    check_given("readStream", given, tables(TOPIC_OPTIONS))
    for key, why in (("kafka.group.id", "replayGroup"), ("startingOffsets", "no replay has marked"),
                     ("subscribe", "the one dead-letter topic")):
        with pytest.raises(RegionalConfigError, match=f"{key!r} is not supported by regional: .*{why}"):
            check_given("readStream", {**given, key: "x"}, tables(TOPIC_OPTIONS))
    # The marks topic follows the group by default, and is never the dead-letter topic itself.
    default = DeadLetterTopicInput({"topic": "orders.dead", "kafka.bootstrap.servers": "h:1"}, read_letters=False)
    assert default.marks_topic == default.group == "regional-replayed-orders.dead"
    with pytest.raises(RegionalConfigError, match="cannot be the topic that keeps which letters"):
        DeadLetterTopicInput({"topic": "t", "kafka.bootstrap.servers": "h:1", "replayMarksTopic": "t"},
                             read_letters=False)
    with pytest.raises(RegionalConfigError, match="replayMarksTopic"):  # a group name no topic can have
        DeadLetterTopicInput({"topic": "t", "kafka.bootstrap.servers": "h:1", "replayGroup": "my group"},
                             read_letters=False)
    # the sink's phase two marks in the same place
    assert "replaymarkstopic" in {k.lower() for k in source.phase_two_options() or {}}
