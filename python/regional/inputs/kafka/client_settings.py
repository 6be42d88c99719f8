"""source=kafka's ``kafka.*`` options: each one reaches the consumers that read (librdkafka, by its own name or by
the Java client's name mapped to librdkafka's), or is refused at start, naming it and saying why.

librdkafka's CONFIGURATION.md marks every property C (consumer), P (producer) or * (both). A P property given to a
consumer is only logged ("will be ignored by this consumer instance"): regional refuses it. The tables below are
data taken from that file (librdkafka 2.15 and 2.16 hold the same names); ``tests/test_kafka_options.py`` checks
them against the installed librdkafka's own table, and :func:`ignored_by_consumer` asks the installed library
itself at start, so a P property a newer librdkafka adds is refused too.

Pure but for :func:`ignored_by_consumer`, which builds (and closes at once) one consumer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from regional.errors import RegionalConfigError

# librdkafka's P (producer-only) properties, global and per topic, aliases included.
PRODUCER_ONLY = frozenset({
    "acks", "batch.num.messages", "batch.size", "compression.codec", "compression.level", "compression.type",
    "delivery.report.only.error", "delivery.timeout.ms", "dr_cb", "dr_msg_cb", "enable.gapless.guarantee",
    "enable.idempotence", "linger.ms", "message.send.max.retries", "message.timeout.ms", "msg_order_cmp",
    "partitioner", "partitioner_cb", "produce.offset.report", "queue.buffering.backpressure.threshold",
    "queue.buffering.max.kbytes", "queue.buffering.max.messages", "queue.buffering.max.ms", "queuing.strategy",
    "request.required.acks", "retries", "sticky.partitioning.linger.ms", "transaction.timeout.ms",
    "transactional.id",
    # request.timeout.ms is P too, and a Java consumer setting as well: see JAVA_ONLY
})
PRODUCER_WHY = ("a producer setting: regional's Kafka source only reads (librdkafka would ignore it in a consumer, "
                "as Spark's Java consumer does): remove it")

_NEVER_JOINS = ("the tasks' consumers are assigned their partitions and never join a consumer group (Spark's do not "
                "either), so it has no effect: remove it")
# C and * properties a regional consumer would take without any effect, or that regional sets itself.
NO_EFFECT = {
    **{name: _NEVER_JOINS for name in (
        "group.instance.id", "partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms",
        "group.protocol.type", "group.protocol", "group.remote.assignor", "coordinator.query.interval.ms",
        "max.poll.interval.ms", "auto.commit.interval.ms", "enable.auto.offset.store", "offset.store.method",
        "offset.store.path", "offset.store.sync.interval.ms", "rebalance_cb", "offset_commit_cb")},
    "auto.commit.enable": "regional commits nothing to a consumer group by itself: set commitOffsetsToGroup to see "
                          "its progress in Kafka's lag tools",
    "max.poll.records": "librdkafka applies it only to share consumers; a task reads its partition's range in lots "
                        "regional sizes itself: remove it",
    "share.acknowledgement.mode": "it applies only to share consumers; regional reads partitions by offset: remove it",
    "consume.callback.max.messages": "it applies only to librdkafka's consume callback, which regional does not use: "
                                     "remove it",
    "consume_cb": "regional reads records itself: remove it",
    "enable.partition.eof": "regional sets it (a task's read ends at the end of the partition's log): remove it",
    "metadata.broker.list": "give the brokers as kafka.bootstrap.servers",
    "statistics.interval.ms": "regional does not collect librdkafka's statistics (no stats_cb): remove it",
    "logger": "regional sends librdkafka's log lines to the Python logger 'regional.kafka.client': set that logger's "
              "level to see them",
}

# The Java client's names (Spark users pass them) that librdkafka spells differently, with the same meaning and unit.
JAVA_SYNONYMS = {
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
}
# The Java client's names librdkafka lacks, or holds with another meaning: refused, saying what to set instead.
_PEM = ("librdkafka reads certificates in PEM (or a PKCS#12 keystore), not Java key stores: set kafka.ssl.ca.location "
        "(a PEM file of the CA certificates) or kafka.ssl.ca.pem instead")
JAVA_ONLY = {
    "request.timeout.ms": "in librdkafka it is a producer setting (a consumer ignores it): set "
                          "kafka.socket.timeout.ms, librdkafka's timeout for a consumer's network requests",
    "default.api.timeout.ms": "librdkafka has no such setting: set metadataTimeoutMs (the driver's metadata and offset "
                              "requests) or kafkaConsumer.pollTimeoutMs (a task's wait for records)",
    "ssl.truststore.location": _PEM,
    "ssl.truststore.password": _PEM,
    "ssl.truststore.type": _PEM,
    "ssl.truststore.certificates": "librdkafka calls it kafka.ssl.ca.pem: use that",
    "ssl.keystore.certificate.chain": "librdkafka calls it kafka.ssl.certificate.pem: use that",
    "ssl.keystore.key": "librdkafka calls it kafka.ssl.key.pem: use that",
    "ssl.keystore.type": "librdkafka reads kafka.ssl.keystore.location as PKCS#12 only (PEM: kafka.ssl.certificate.pem "
                         "and kafka.ssl.key.pem): remove it",
    "sasl.jaas.config": "librdkafka takes no JAAS configuration: set kafka.sasl.username and kafka.sasl.password "
                        "(PLAIN and SCRAM), or librdkafka's kafka.sasl.oauthbearer.* settings (OAUTHBEARER)",
}


def refusal(name: str) -> str | None:
    """Why ``kafka.<name>`` (lower-cased, without ``kafka.``) is refused, or None when it goes to the consumers."""
    if name in PRODUCER_ONLY:
        return PRODUCER_WHY
    return NO_EFFECT.get(name) or JAVA_ONLY.get(name)


def consumer_settings(options: Mapping[str, str]) -> dict[str, str]:
    """The consumers' settings from the ``kafka.*`` options (lower-cased keys), in librdkafka's names, without
    ``kafka.bootstrap.servers``. Raises RegionalConfigError naming the first refused one."""
    conf: dict[str, str] = {}
    given_as: dict[str, str] = {}
    for key in sorted(options):
        if not key.startswith("kafka.") or key == "kafka.bootstrap.servers":
            continue
        name = key[len("kafka."):]
        why = refusal(name)
        if why is not None:
            raise RegionalConfigError(f"source=kafka does not take {key!r}: it is {why}" if why is PRODUCER_WHY
                                      else f"source=kafka does not take {key!r}: {why}")
        put_setting(conf, given_as, key, options[key], JAVA_SYNONYMS, "source=kafka")
    return conf


def put_setting(conf: dict[str, str], given_as: dict[str, str], key: str, value: str, synonyms: Mapping[str, str],
                side: str) -> None:
    """``kafka.<name>=value`` (``key``) into ``conf`` under librdkafka's name (``synonyms``: Java's names it spells
    otherwise). Two keys for one librdkafka setting with two values are refused, naming both (``given_as``: which
    key gave each setting)."""
    name = key[len("kafka."):]
    target = synonyms.get(name, name)
    if name in ("send.buffer.bytes", "receive.buffer.bytes") and value.strip() == "-1":
        value = "0"  # Java's "the system's default" is librdkafka's 0
    if target in conf and conf[target] != value:
        raise RegionalConfigError(f"{side}: {given_as[target]!r} and {key!r} are the same librdkafka setting "
                                  f"({target}) with different values: give one")
    conf[target], given_as[target] = value, key


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def ignored_by(kind: str, conf: Mapping[str, object]) -> list[str]:
    """librdkafka's own word on ``conf`` (a ``kind`` client's configuration: "consumer" or "producer", without
    ``logger``): the properties it would ignore in such a client (its CONFWARN lines, "will be ignored by this
    <kind> instance", logged when the client is built and delivered when it is dropped)."""
    from confluent_kafka import Consumer, Producer

    collect = _Collect()
    logger = logging.Logger("regional.kafka.conf-check")  # not registered: nothing else sees these lines
    logger.addHandler(collect)
    if kind == "consumer":
        Consumer({**conf, "logger": logger}).close()
    else:
        producer = Producer({**conf, "logger": logger})
        producer.flush(0)
        del producer  # its log lines are delivered as it is destroyed
    ignored = f"will be ignored by this {kind} instance"
    found = []
    for line in collect.lines:
        if ignored in line and "Configuration property " in line:
            found.append(line.split("Configuration property ", 1)[1].split(" ", 1)[0])
    return found


def ignored_by_consumer(conf: Mapping[str, object]) -> list[str]:
    """The properties of ``conf`` librdkafka would ignore in a consumer (:func:`ignored_by`)."""
    return ignored_by("consumer", conf)
