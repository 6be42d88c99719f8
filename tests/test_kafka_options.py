"""source=kafka's kafka.* options: every one reaches the tasks' consumers (librdkafka) or is refused at start by name,
checked against the installed librdkafka's own table of properties (C consumer, P producer, * both)."""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import subprocess
import tempfile

import pytest

from regional.errors import RegionalConfigError
from regional.inputs.kafka import KafkaInput
from regional.inputs.kafka import client_settings as settings

BASE = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "orders"}


def installed_table() -> dict[str, str]:
    """property -> scope (C, P or *) as the installed librdkafka prints its CONFIGURATION.md table
    (rd_kafka_conf_properties_show), global and topic properties alike."""
    import confluent_kafka

    here = os.path.dirname(confluent_kafka.__file__)
    found = glob.glob(os.path.join(here, os.pardir, "confluent_kafka.libs", "librdkafka*")) or glob.glob(
        os.path.join(here, ".dylibs", "librdkafka*"))
    assert found, "the confluent-kafka wheel's bundled librdkafka was not found"
    lib, libc = ctypes.CDLL(found[0]), ctypes.CDLL(None)
    libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_conf_properties_show.argtypes = [ctypes.c_void_p]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "CONFIGURATION.md")
        handle = libc.fopen(path.encode(), b"w")
        lib.rd_kafka_conf_properties_show(handle)
        libc.fclose(handle)
        with open(path) as f:
            text = f.read()
    table = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 5 and cells[1] in ("C", "P", "*"):
            table[cells[0]] = cells[1]
    assert len(table) > 150, "librdkafka's table did not parse"
    return table


TABLE = installed_table()


def test_the_producer_table_is_the_installed_librdkafkas():
    producer = {name for name, scope in TABLE.items() if scope == "P"}
    assert producer == settings.PRODUCER_ONLY | {"request.timeout.ms"}


def test_every_name_the_tables_refuse_or_map_as_librdkafkas_is_one_it_knows_in_that_scope():
    for name in settings.NO_EFFECT:
        assert name == "logger" or TABLE.get(name) in ("C", "*"), name
    for java, ours in settings.JAVA_SYNONYMS.items():
        assert java not in TABLE and TABLE[ours] in ("C", "*"), java
    for name in settings.JAVA_ONLY:
        assert name not in TABLE or TABLE[name] == "P" or name == "ssl.keystore.type", name


@pytest.mark.parametrize("name", sorted(n for n, scope in TABLE.items() if scope == "P"))
def test_every_producer_setting_is_refused_by_name(name):
    with pytest.raises(RegionalConfigError, match=f"does not take 'kafka.{name}'"):
        KafkaInput({**BASE, f"kafka.{name}": "1"})


@pytest.mark.parametrize("name", ["linger.ms", "acks", "retries", "compression.type", "batch.size",
                                  "delivery.timeout.ms", "transactional.id", "enable.idempotence"])
def test_librdkafka_itself_is_asked_so_a_producer_setting_missing_from_the_table_is_refused(monkeypatch, name):
    monkeypatch.setattr(settings, "PRODUCER_ONLY", frozenset())
    value = {"acks": "all", "compression.type": "gzip", "enable.idempotence": "true", "transactional.id": "t"}
    with pytest.raises(RegionalConfigError, match=f"'kafka.{name}': librdkafka says its consumer would ignore"):
        KafkaInput({**BASE, f"kafka.{name}": value.get(name, "5")})


@pytest.mark.parametrize("name, message", [
    ("request.timeout.ms", "set kafka.socket.timeout.ms"),
    ("max.poll.records", "only to share consumers"),
    ("session.timeout.ms", "never join a consumer group"),
    ("heartbeat.interval.ms", "never join a consumer group"),
    ("max.poll.interval.ms", "never join a consumer group"),
    ("partition.assignment.strategy", "never join a consumer group"),
    ("group.instance.id", "never join a consumer group"),
    ("auto.commit.enable", "commitOffsetsToGroup"),
    ("enable.partition.eof", "regional sets it"),
    ("statistics.interval.ms", "statistics"),
    ("logger", "regional.kafka.client"),
    ("metadata.broker.list", "kafka.bootstrap.servers"),
    ("default.api.timeout.ms", "metadataTimeoutMs"),
    ("ssl.truststore.location", "kafka.ssl.ca.location"),
    ("ssl.keystore.type", "PKCS#12"),
    ("sasl.jaas.config", "kafka.sasl.username"),
])
def test_settings_without_effect_and_java_names_librdkafka_lacks_are_refused_saying_what_to_do(name, message):
    with pytest.raises(RegionalConfigError, match=f"'kafka.{name}'.*{message}"):
        KafkaInput({**BASE, f"kafka.{name}": "1"})


def test_java_names_librdkafka_spells_differently_reach_the_consumer_in_librdkafkas_names():
    source = KafkaInput({**BASE, "kafka.fetch.max.wait.ms": "7", "kafka.receive.buffer.bytes": "-1",
                         "kafka.send.buffer.bytes": "131072"})
    conf = source._read_conf()
    assert conf["fetch.wait.max.ms"] == "7"
    assert conf["socket.receive.buffer.bytes"] == "0"  # Java's -1, the system's default, is librdkafka's 0
    assert conf["socket.send.buffer.bytes"] == "131072"
    assert not {"fetch.max.wait.ms", "receive.buffer.bytes", "send.buffer.bytes"} & set(conf)
    with pytest.raises(RegionalConfigError, match=r"same librdkafka setting \(fetch.wait.max.ms\)"):
        KafkaInput({**BASE, "kafka.fetch.max.wait.ms": "7", "kafka.fetch.wait.max.ms": "8"})


def test_consumer_settings_reach_the_tasks_consumers_and_librdkafka_takes_them_without_a_warning():
    given = {"check.crcs": "true", "fetch.min.bytes": "10", "client.id": "mine", "security.protocol": "PLAINTEXT",
             "queued.min.messages": "1000", "fetch.error.backoff.ms": "100", "socket.timeout.ms": "20000",
             "client.rack": "r1", "allow.auto.create.topics": "false"}
    source = KafkaInput({**BASE, **{f"kafka.{k}": v for k, v in given.items()}})
    conf = source._read_conf()
    assert {k: conf[k] for k in given} == given
    assert settings.ignored_by_consumer({k: v for k, v in conf.items() if k != "logger"}) == []


def test_the_check_sees_librdkafkas_warning():
    assert settings.ignored_by_consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g",
                                         "linger.ms": "5"}) == ["queue.buffering.max.ms"]


# subscribePattern: Java's regular expressions, found anywhere in a topic's name (Spark's findFirstIn)
TOPICS = ["orders-eu", "orders-tx", "orders-us", "orders-t", "ORDERS-eu", "x.orders-eu", "orders-eu-2", "a.b", "axb",
          "aab", "eu-eu", "eu-us", "orders"]
# pattern -> the topics Java's Pattern.compile(p).matcher(topic).find() accepts (Java 17's documented semantics;
# test_the_table_is_what_java_says checks them with jshell where a JDK is installed)
SAME = {
    "orders-[a-z]+": ["orders-eu", "orders-tx", "orders-us", "orders-t", "x.orders-eu", "orders-eu-2"],
    "^orders-(eu|us)$": ["orders-eu", "orders-us"],
    "orders": ["orders-eu", "orders-tx", "orders-us", "orders-t", "x.orders-eu", "orders-eu-2", "orders"],
    r"\Qa.b\E": ["a.b"],
    r"\Qa.b": ["a.b"],
    r"[\Q.\E]b": ["a.b"],
    "a.b": ["a.b", "axb", "aab"],
    r"orders-eu\z": ["orders-eu", "x.orders-eu"],
    r"orders-eu\Z": ["orders-eu", "x.orders-eu"],
    r"\Aorders-eu": ["orders-eu", "orders-eu-2"],
    "(?i)^orders-eu$": ["orders-eu", "ORDERS-eu"],
    "(?i:ORDERS)-EU": [],
    "(?i:ORDERS)-eu": ["orders-eu", "ORDERS-eu", "x.orders-eu", "orders-eu-2"],
    r"^(?<r>eu|us)-\k<r>$": ["eu-eu"],
    "^orders-[a-z]++u": [],  # possessive: [a-z]++ takes the u too
    "^orders-[a-z]+u": ["orders-eu", "orders-eu-2"],
    "^orders-(?>e|eu)-": [],  # atomic: e is kept, -  does not follow
    "^orders-(?>eu|e)-": ["orders-eu-2"],
    "^a{2}b$": ["aab"],
    r"^\x{61}\x61b$": ["aab"],
    r"^\0141ab$": ["aab"],
    r"^\N{LATIN SMALL LETTER A}ab$": ["aab"],
    r"a\cAb|^eu-us$": ["eu-us"],  # \cA: U+0001
    r"^orders-\w\w$": ["orders-eu", "orders-tx", "orders-us"],
    r"^orders-[^\W_t]+$": ["orders-eu", "orders-us"],
    "^[]a]": ["a.b", "axb", "aab"],
    "[a&b]$": ["a.b", "axb", "aab"],
    r"orders\b": ["orders-eu", "orders-tx", "orders-us", "orders-t", "x.orders-eu", "orders-eu-2", "orders"],
}
REFUSED = {
    "orders-[a-z&&[^t]]+": "intersection &&",
    "orders-[a-c[x-z]]": "a class inside a class",
    r"orders-\p{Lower}+": r"\\p\{...\}",
    r"orders-\P{Digit}": r"\\P\{...\}",
    "(?d)orders": r"\(\?d\), UNIX_LINES",
    "(?u)orders": r"\(\?u\), UNICODE_CASE",
    "(?U)orders": r"\(\?U\), UNICODE_CHARACTER_CLASS",
    "(?x)orders": r"\(\?x\), COMMENTS",
    r"orders\h": r"\\h",
    r"orders\R": r"\\R",
    r"orders\X": r"\\X",
    r"\Gorders": r"\\G",
    r"orders\v": r"\\v",
    r"orders\b{g}": r"\\b\{g\}",
    "orders-(?i)eu": "in the middle of a pattern",
    "(?P<n>orders)": "a group Java does not define",
    "(?#note)orders": "a group Java does not define",
    "orders{,3}": "not a repetition",
    "orders{": "not a repetition",
    r"orders\y": r"\\y, an escape Java does not define",
}


@pytest.mark.parametrize("pattern", sorted(SAME))
def test_a_java_pattern_finds_the_topics_java_finds(pattern):
    source = KafkaInput({**BASE, "subscribe": "", "subscribePattern": f" {pattern} "})  # trimmed, as Spark
    assert [t for t in TOPICS if source.pattern.search(t)] == SAME[pattern]  # type: ignore[union-attr]


@pytest.mark.parametrize("pattern", sorted(REFUSED))
def test_a_construct_python_reads_differently_is_refused_by_name(pattern):
    with pytest.raises(RegionalConfigError, match=f"subscribePattern .* uses .*{REFUSED[pattern]}"):
        KafkaInput({**BASE, "subscribe": "", "subscribePattern": pattern})


@pytest.mark.skipif(shutil.which("javac") is None, reason="no JDK: the table's Java results are from Java's docs")
def test_the_table_is_what_java_says(tmp_path):
    """One run of Java's source launcher: Java's find() over every topic for every pattern of SAME."""
    def java(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    body = [f"String[] topics = {{{', '.join(java(t) for t in TOPICS)}}};"]
    for pattern in SAME:
        body.append(f"{{ java.util.regex.Pattern p = java.util.regex.Pattern.compile({java(pattern)}); "
                    "StringBuilder b = new StringBuilder(\"R\"); for (String t : topics) if (p.matcher(t).find()) "
                    "b.append(\"|\" + t); System.out.println(b); }")
    source = tmp_path / "Table.java"
    source.write_text("public class Table { public static void main(String[] a) {\n" + "\n".join(body) + "\n} }\n")
    done = subprocess.run(["java", str(source)], capture_output=True, text=True, timeout=120)
    results = [line for line in done.stdout.splitlines() if line.startswith("R")]
    assert len(results) == len(SAME), done.stdout + done.stderr
    for pattern, line in zip(SAME, results, strict=True):
        assert line.split("|")[1:] == SAME[pattern], pattern
