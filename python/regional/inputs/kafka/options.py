"""source=kafka's options: every option of Spark's Kafka source (spark-sql-kafka-0-10, Spark 4.2), each honoured with
Spark's meaning or refused at start, and regional's own two; and the parsing of the starting point.

Pure: no client, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from regional.errors import RegionalConfigError
from regional.options import Option, OptionTable

EARLIEST, LATEST = -2, -1

# Spark refuses these consumer settings at start (KafkaSourceProvider.validateGeneralOptions); so does regional.
REFUSED = {
    "kafka.auto.offset.reset": "Structured Streaming decides where to start: set startingOffsets ('earliest' or "
                               "'latest'), startingTimestamp or startingOffsetsByTimestamp instead",
    "kafka.enable.auto.commit": "regional commits nothing to a consumer group by itself: set commitOffsetsToGroup to "
                                "see its progress in Kafka's lag tools",
    "kafka.key.deserializer": "keys are read as bytes (the binary key column): cast it or decode it with a UDF",
    "kafka.value.deserializer": "values are read as bytes (the binary value column): cast it or decode it with a UDF",
    "kafka.interceptor.classes": "consumer interceptors could change records (and Java interceptors do not exist in "
                                 "regional's client, librdkafka): remove it",
}
NOT_STREAMING = "Spark refuses it in streaming queries (a stream has no end): remove it"

OPTIONS = OptionTable("source=kafka", [
    Option("kafka.bootstrap.servers", "required", "The brokers, `host:port[,host:port...]`.", stock=True),
    Option("subscribe", "", "A comma list of topics to read (exactly one of `subscribe`, `subscribePattern`, "
                            "`assign`).", stock=True),
    Option("subscribePattern", "", "A Java regular expression, as Spark's (translated to Python's `re`; a "
                                   "construct Python reads differently is refused by name, see below): every "
                                   "topic whose name it finds a match in (as Spark does: a match anywhere in the "
                                   "name, anchor it with `^...$` for whole names), "
                                   "except the broker's internal topics (`__consumer_offsets`, `__transaction_state`, "
                                   "...; a user topic named `__x` is read). Topics created later join.", stock=True),
    Option("assign", "", 'JSON `{"topicA": [0, 1]}`: exactly these partitions.', stock=True),
    Option("startingOffsets", "latest", "Where a new query starts: `earliest`, `latest`, or JSON "
                                        '`{"topicA": {"0": 23, "1": -2}}` naming every partition (-2 earliest, '
                                        "-1 latest). A restarted query goes on from its checkpoint.", stock=True),
    Option("startingTimestamp", "", "Milliseconds since the epoch: a new query starts each partition at its first "
                                    "record with a timestamp at or after it (Kafka's offsets-for-times). Takes "
                                    "precedence over the other starting options in Spark: give only one.", stock=True),
    Option("startingOffsetsByTimestamp", "", 'JSON `{"topicA": {"0": 1700000000000, "1": ...}}` naming every '
                                             "partition: as `startingTimestamp`, per partition.", stock=True),
    Option("startingOffsetsByTimestampStrategy", "error", "A partition with no record at or after its starting "
                                                          "timestamp: `error` fails the start, `latest` starts it at "
                                                          "its end.", stock=True),
    Option("endingOffsets", "", "", refused=NOT_STREAMING, stock=True),
    Option("endingOffsetsByTimestamp", "", "", refused=NOT_STREAMING, stock=True),
    Option("endingTimestamp", "", "", refused="a stream has no end (Spark's streaming source ignores it without a "
                                              "word): remove it", stock=True),
    Option("failOnDataLoss", "true", "Records deleted before they were read (retention, a topic deleted or created "
                                     "again) fail the query; `false` goes on after them and records the loss in the "
                                     "epoch record.", stock=True),
    Option("maxOffsetsPerTrigger", "", "At most this many offsets per epoch over all partitions (regional's "
                                       "`maxRecordsPerTrigger`).", stock=True),
    Option("minOffsetsPerTrigger", "", "", refused="regional does not hold an epoch back until enough records are "
                                                   "waiting: remove it (a longer processing-time trigger gathers more "
                                                   "records per epoch)", stock=True),
    Option("maxTriggerDelay", "", "", refused="it only bounds minOffsetsPerTrigger's wait, which regional does not "
                                              "take: remove it", stock=True),
    Option("minPartitions", "", "", refused="regional reads each Kafka partition (a region) in one task, so that it "
                                            "can commit or fall back alone: remove it (more Kafka partitions give "
                                            "more parallelism)", stock=True),
    Option("maxRecordsPerPartition", "", "", refused="regional reads each Kafka partition (a region) in one task: "
                                                     "remove it, or cap each partition's epoch with "
                                                     "maxRecordsPerRegion", stock=True),
    Option("groupIdPrefix", "regional-reader", "The consumer group id of the tasks' consumers is this prefix and a "
                                               "random suffix (they never join the group nor commit; the id matters "
                                               "to ACLs and quotas). `kafka.group.id` wins.", stock=True),
    Option("includeHeaders", "false", "Add Spark's `headers` column: `array<struct<key: string, value: binary>>`, "
                                      "in the record's order, duplicate keys and null values kept; null for a record "
                                      "without headers.", stock=True),
    Option("kafkaConsumer.pollTimeoutMs", "120000", "A task waiting this long for records it knows exist fails.",
           stock=True),
    Option("fetchOffset.numRetries", "", "When given, the driver's offset listing fails after this many retries "
                                         "(without it: it retries for metadataTimeoutMs).", stock=True),
    Option("fetchOffset.retryIntervalMs", "500", "The wait between retries of the driver's offset listing.",
           stock=True),
    Option("kafka.group.id", "", "The consumer group id of the tasks' consumers (never joined nor committed to).",
           stock=True),
    Option("kafka.isolation.level", "read_uncommitted", "`read_committed` reads only committed transactions' "
                                                        "records (and ends each epoch at the last stable offset); "
                                                        "`read_uncommitted` reads aborted ones too, as Spark.",
           stock=True),
    *(Option(key, "", "", refused=why, stock=True) for key, why in REFUSED.items()),
    Option("kafka.", "", "Any other consumer setting, to the tasks' consumers, in librdkafka's names (most are "
                         "Java's: `kafka.security.protocol`, `kafka.sasl.mechanism`, ...; Java's "
                         "`kafka.fetch.max.wait.ms`, `kafka.send.buffer.bytes` and `kafka.receive.buffer.bytes` are "
                         "mapped to librdkafka's). Refused at start, naming it and why: a setting librdkafka does not "
                         "know, a producer setting (`kafka.linger.ms`, `kafka.acks`, ...), `kafka.request.timeout.ms` "
                         "(a producer setting in librdkafka: use `kafka.socket.timeout.ms`), `kafka.max.poll.records` "
                         "and group-membership settings (no effect: the consumers never join a group), and the Java "
                         "names librdkafka lacks (`kafka.ssl.truststore.*`, `kafka.sasl.jaas.config`, ...).",
           prefix=True, stock=True),
    Option("commitOffsetsToGroup", "", "After each recorded epoch, commit every region's committed offset to this "
                                       "consumer group, so that Kafka's lag tools show regional's progress."),
    Option("metadataTimeoutMs", "30000", "How long the driver waits for the brokers' metadata and offsets."),
])


@dataclass(frozen=True)
class Starting:
    """Where a new query starts: ``kind`` is ``earliest``, ``latest``, ``offsets`` (per partition, -2/-1 allowed),
    ``timestamp`` (one for all partitions) or ``timestamps`` (per partition); ``no_match`` is what a partition with
    no record at or after its timestamp does: ``error`` or ``latest``."""

    kind: str
    per_partition: dict[str, dict[int, int]] | None = None  # offsets or timestamps, by topic and partition
    timestamp: int | None = None
    no_match: str = "error"


def parse_starting(opts: Mapping[str, str]) -> Starting:
    """Spark's three starting options (lower-cased keys). Spark takes startingTimestamp over
    startingOffsetsByTimestamp over startingOffsets and ignores the others; regional refuses more than one."""
    given = [k for k in ("startingtimestamp", "startingoffsetsbytimestamp", "startingoffsets") if k in opts]
    names = {"startingtimestamp": "startingTimestamp", "startingoffsetsbytimestamp": "startingOffsetsByTimestamp",
             "startingoffsets": "startingOffsets"}
    if len(given) > 1:
        raise RegionalConfigError(
            f"source=kafka: {' and '.join(names[k] for k in given)} both say where to start; give one (Spark would "
            f"take {names[given[0]]} and ignore the rest)")
    strategy = opts.get("startingoffsetsbytimestampstrategy")
    no_match = "error"
    if strategy is not None:
        if not given or given[0] == "startingoffsets":
            raise RegionalConfigError("source=kafka: startingOffsetsByTimestampStrategy applies only with "
                                      "startingTimestamp or startingOffsetsByTimestamp: remove it, or give one of them")
        no_match = strategy.strip().lower()
        if no_match not in ("error", "latest"):
            raise RegionalConfigError(f"source=kafka: startingOffsetsByTimestampStrategy={strategy!r}: use 'error' "
                                      "(the default) or 'latest'")
    if given and given[0] == "startingtimestamp":
        text = opts["startingtimestamp"].strip()
        try:
            return Starting("timestamp", timestamp=int(text), no_match=no_match)
        except ValueError:
            raise RegionalConfigError(f"source=kafka: startingTimestamp {text!r} is not a whole number of "
                                      "milliseconds since 1970-01-01 UTC (e.g. 1700000000000)") from None
    if given and given[0] == "startingoffsetsbytimestamp":
        return Starting("timestamps", per_partition=_per_partition(opts["startingoffsetsbytimestamp"],
                                                                   "startingOffsetsByTimestamp", None),
                        no_match=no_match)
    text = opts.get("startingoffsets", "latest")
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return Starting(word)
    return Starting("offsets", per_partition=_per_partition(text, "startingOffsets", EARLIEST))


def _per_partition(text: str, name: str, minimum: int | None) -> dict[str, dict[int, int]]:
    example = ('{"topicA": {"0": 23, "1": -2}}' if minimum is not None
               else '{"topicA": {"0": 1700000000000, "1": 1700000000000}}')
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not data:
            raise ValueError("expected a JSON object")
        parsed: dict[str, dict[int, int]] = {}
        for topic, parts in data.items():
            if not isinstance(parts, dict) or not parts:
                raise ValueError(f"topic {topic!r} maps to {parts!r}, not to an object of partition -> value")
            parsed[str(topic)] = {int(p): int(v) for p, v in parts.items()}
            if minimum is not None and any(v < minimum for v in parsed[str(topic)].values()):
                raise ValueError("offsets are >= 0, or -2 (earliest) or -1 (latest)")
        return parsed
    except (ValueError, TypeError) as exc:
        words = "'earliest', 'latest' or JSON such as" if name == "startingOffsets" else "JSON such as"
        raise RegionalConfigError(f"source=kafka: {name} {text!r} is not {words} {example} ({exc})") from None


def parse_assign(text: str) -> dict[str, list[int]]:
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not data or not all(isinstance(ps, list) and ps for ps in data.values()):
            raise ValueError("expected a JSON object of topic -> non-empty list of partitions")
        return {str(t): sorted({int(p) for p in ps}) for t, ps in data.items()}
    except (ValueError, TypeError) as exc:
        raise RegionalConfigError(f"source=kafka: assign {text!r} is not valid: {exc}; write it as "
                                  '{"topicA": [0, 1], "topicB": [2]}') from None
