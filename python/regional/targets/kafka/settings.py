"""target=kafka's options: Spark's Kafka sink's (``topic``, ``kafka.*``) with Spark's meaning, and regional's own.

Every ``kafka.*`` option reaches the producer that publishes (librdkafka, by its own name or by the Java client's
name mapped to librdkafka's), or is refused at start, naming it and saying why: a consumer-only setting (the
installed librdkafka is asked, as the Kafka source asks it about producer settings), a Java name librdkafka lacks,
or a setting exactly once needs regional to own (the transactional id, idempotence, ``acks=all``). The
producer's settings are kept apart from everything regional stores: they may hold credentials.

Pure but for :func:`check_producer`, which builds (and drops at once) one producer without reaching a broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from regional.errors import RegionalConfigError
from regional.inputs.kafka.client_settings import JAVA_ONLY, ignored_by, put_setting
from regional.location import Location, parse_location
from regional.options import Option, OptionTable
from regional.protocol.settings import parse_int
from regional.targets.kafka.records import illegal_topic

PREFIX = "kafka."

OPTIONS = OptionTable("target=kafka", [
    Option("kafka.bootstrap.servers", "required", "The brokers, as Spark's Kafka sink takes them.", stock=True),
    Option("kafka.", "", "Every librdkafka producer setting by its name (Java's names where they differ: "
                         "`kafka.max.request.size`, `kafka.send.buffer.bytes`, `kafka.receive.buffer.bytes`); never "
                         "stored, logged or put into the plan. Consumer settings and what exactly once owns are "
                         "refused by name.", prefix=True, stock=True),
    Option("topic", "", "The topic of every row, over the rows' `topic` column (as in Spark). Without it, each row "
                        "needs a `topic`.", stock=True),
    Option("includeHeaders", "", "", stock=True,
           refused="a Kafka source option in Spark: the sink writes a `headers` column whenever the query has one"),
    Option("stagingLocation", "<checkpointLocation>/kafka-staging",
           "Where each task stages its region's rows (Arrow files, under the query's id) until the driver produces "
           "them in the epoch's transaction: a place the executors and the driver both reach (local, `s3a://`, "
           "...), as Spark's state store needs its checkpoint to be."),
    Option("timeoutMs", "60000", "Each call to the brokers in phase two (the transaction's start, commit and "
                                 "marker), in milliseconds; a task's metadata request too."),
])

# Java producer names librdkafka spells differently, with the same meaning and unit.
JAVA_SYNONYMS = {
    "max.request.size": "message.max.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
}
_EXACTLY_ONCE = "regional's exactly once needs it"
# Settings regional owns, and the only value it accepts for each (None: none).
OWNED: dict[str, tuple[frozenset[str], str]] = {
    "transactional.id": (frozenset(), "regional names the epoch's transaction after the query "
                                      "(regional-<query id>-kafka) so that a restart fences its zombie"),
    "enable.idempotence": (frozenset({"true"}), f"{_EXACTLY_ONCE} on"),
    "acks": (frozenset({"all", "-1"}), f"{_EXACTLY_ONCE} at acks=all (every in-sync replica has each record before "
                                       "the epoch is recorded)"),
    "request.required.acks": (frozenset({"all", "-1"}), f"{_EXACTLY_ONCE} at acks=all"),
}
# Java names with no librdkafka producer setting, or that would do nothing here.
PRODUCER_REFUSED = {
    **{name: why for name, why in JAVA_ONLY.items() if name != "request.timeout.ms"},  # a producer setting: honoured
    "key.serializer": "keys are written as bytes (a string key as its UTF-8 bytes), as Spark's Kafka sink refuses "
                      "it for the same reason",
    "value.serializer": "values are written as bytes (a string value as its UTF-8 bytes), as Spark's Kafka sink "
                        "refuses it for the same reason",
    "partitioner.class": "librdkafka takes no Java class: set kafka.partitioner (murmur2_random, Java's default, is "
                         "regional's default too)",
    "interceptor.classes": "Java producer interceptors do not exist in librdkafka: remove it",
    "buffer.memory": "librdkafka bounds its queue with kafka.queue.buffering.max.kbytes (in kilobytes): use that",
    "max.block.ms": "regional waits for a full queue itself, up to timeoutMs: remove it",
    "metric.reporters": "librdkafka has no metric reporters: remove it",
    "logger": "regional sends librdkafka's log lines to the Python logger 'regional.kafka.client'",
    "metadata.broker.list": "give the brokers as kafka.bootstrap.servers",
    "statistics.interval.ms": "regional collects no librdkafka statistics (no stats_cb): remove it",
}
MAX_IN_FLIGHT = 5  # idempotence keeps order only up to 5 requests in flight per connection


@dataclass(frozen=True)
class KafkaTargetSettings:
    bootstrap: str
    topic: str | None  # every row's topic, over the column
    staging: Location
    timeout_s: float


def parse_settings(options: Mapping[str, str]) -> KafkaTargetSettings:
    """The target's settings from the sink's options (lower-cased keys)."""
    bootstrap = options.get("kafka.bootstrap.servers", "").strip()
    if not bootstrap:
        raise RegionalConfigError("target=kafka needs its brokers: add .option('kafka.bootstrap.servers', "
                                  "'host:9092') to writeStream")
    topic = options.get("topic")
    if topic is not None and not topic.strip():
        raise RegionalConfigError("target=kafka: the topic option is empty: name a topic, or leave the option out "
                                  "and give each row a 'topic' column")
    if topic is not None:
        why = illegal_topic(topic.strip())
        if why is not None:
            raise RegionalConfigError(f"target=kafka: the topic option: {why}: name a topic Kafka can create")
    staging = options.get("staginglocation", "").strip()
    if not staging:
        checkpoint = options.get("checkpointlocation", "").strip()
        if not checkpoint:
            raise RegionalConfigError("target=kafka stages rows under the checkpoint: the sink needs "
                                      ".option('checkpointLocation', ...), or set stagingLocation")
        staging = checkpoint.rstrip("/") + "/kafka-staging"
    return KafkaTargetSettings(bootstrap, topic.strip() if topic is not None else None,
                               parse_location("stagingLocation", staging),
                               parse_int(options, "timeoutMs", minimum=1, default="60000") / 1000)


def producer_settings(options: Mapping[str, str]) -> dict[str, str]:
    """The producer's settings from the ``kafka.*`` options (lower-cased keys), in librdkafka's names, with
    ``bootstrap.servers``. Raises RegionalConfigError naming the first refused one."""
    conf: dict[str, str] = {}
    given_as: dict[str, str] = {}
    for key in sorted(options):
        if not key.startswith(PREFIX):
            continue
        name, value = key[len(PREFIX):], str(options[key])
        why = PRODUCER_REFUSED.get(name)
        if why is not None:
            raise RegionalConfigError(f"target=kafka does not take {key!r}: {why}")
        if name in OWNED:
            allowed, reason = OWNED[name]
            if value.strip().lower() not in allowed:
                raise RegionalConfigError(f"target=kafka does not take {key}={value!r}: {reason}; remove it")
        if name in ("max.in.flight.requests.per.connection", "max.in.flight"):
            if _int_or_none(value) is None or not 1 <= int(value) <= MAX_IN_FLIGHT:
                raise RegionalConfigError(f"target=kafka: {key} must be 1 to {MAX_IN_FLIGHT}: the idempotent "
                                          "producer keeps each partition's order only so")
        if name in ("retries", "message.send.max.retries") and _int_or_none(value) == 0:
            raise RegionalConfigError(f"target=kafka: {key}=0 would turn a broker's passing error into a failed "
                                      "epoch; the idempotent producer retries without duplicates: remove it")
        put_setting(conf, given_as, key, value, JAVA_SYNONYMS, "target=kafka")
    return conf


def check_producer(conf: Mapping[str, str]) -> None:
    """At start: a ``kafka.*`` name librdkafka does not know, or knows as a consumer's only, fails here, naming it
    (no broker is reached)."""
    try:
        ignored = ignored_by("producer", {**conf, "transactional.id": "regional-check", "enable.idempotence": True})
    except Exception as exc:  # KafkaException, ValueError, TypeError: an unknown name or a bad value
        raise RegionalConfigError(f"target=kafka: a kafka.* option is not a producer setting: {exc}") from None
    if ignored:  # librdkafka names a property by its canonical name: find the one the user gave
        base = {"bootstrap.servers": conf.get("bootstrap.servers", "")}
        given = [k for k, v in conf.items() if k != "bootstrap.servers" and ignored_by("producer", {**base, k: v})]
        raise RegionalConfigError(f"target=kafka does not take 'kafka.{(given or ignored)[0]}': a consumer setting "
                                  "(the target only produces; librdkafka would ignore it): remove it")


def _int_or_none(value: str) -> int | None:
    try:
        return int(value.strip())
    except ValueError:
        return None

