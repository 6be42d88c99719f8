"""A real Kafka broker in KRaft mode on loopback ports, for tests and benchmarks (no Docker).

The broker is ``kafka.Kafka`` from the ``org.apache.kafka:kafka_2.13`` jars on Maven Central. The jars
are fetched with Maven once, into ``~/.cache/regional/kafka-<version>/lib`` (outside the repository),
and reused. ``KafkaBroker`` formats a fresh log directory, starts the broker, waits for its port and
stops it (``stop``/``kill``); ``restart`` keeps the data.

``python -m regional.testing.kafka_broker`` runs one on ``localhost:9092`` until Ctrl-C, for trying the docs'
Kafka examples on a machine without a broker (topics are created on first use, as Kafka's own default).
"""

from __future__ import annotations

import argparse
import atexit
import logging
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from regional.testing import maven
from regional.testing.processes import kill_group, log_tail, stop_group

log = logging.getLogger("regional.testing.kafka")
KAFKA_VERSION = "4.1.1"
START_TIMEOUT_S = 90.0

def broker_jars(version: str = KAFKA_VERSION) -> Path:
    """The directory of the broker's jars, fetched with Maven on first use."""
    return maven.fetch(f"kafka-{version}", [f"org.apache.kafka:kafka_2.13:{version}"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KafkaBroker:
    """One broker (and its own KRaft controller) on 127.0.0.1."""

    def __init__(self, workdir: Path, partitions: int = 1, port: int = 0, auto_create_topics: bool = False) -> None:
        """``port`` 0: a free one. Tests create their topics (``auto_create_topics`` off): a typo fails."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.lib = broker_jars()
        self.port, self.controller_port = port or free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.logs = self.workdir / "logs"
        self.properties = self.workdir / "server.properties"
        self.properties.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={self.logs}",
            f"num.partitions={partitions}",
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            f"auto.create.topics.enable={str(auto_create_topics).lower()}",
            # retention is checked often, so tests can delete old segments on demand
            "log.retention.check.interval.ms=1000",
            "log.segment.delete.delay.ms=0",
            "",
        ]))
        self.process: subprocess.Popen[bytes] | None = None
        self._admin = None
        cluster = subprocess.run(self._java("kafka.tools.StorageTool", "random-uuid"), check=True,
                                 capture_output=True, text=True).stdout.strip()
        subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(self.properties)),
                       check=True, capture_output=True)

    def _java(self, main: str, *args: str, heap: str = "256m") -> list[str]:
        return ["java", f"-Xmx{heap}", "-cp", f"{self.lib}/*",
                f"-Dlog4j2.configurationFile={self._log_config()}", main, *args]

    def _log_config(self) -> Path:
        path = self.workdir / "log4j2.properties"
        if not path.exists():
            path.write_text("rootLogger.level=warn\nrootLogger.appenderRef.f.ref=F\n"
                            "appender.f.type=File\nappender.f.name=F\n"
                            f"appender.f.fileName={self.workdir / 'broker.log'}\n"
                            "appender.f.layout.type=PatternLayout\nappender.f.layout.pattern=%d %p %c - %m%n\n")
        return path

    def start(self) -> KafkaBroker:
        out = open(self.workdir / "broker.out", "ab")
        self.process = subprocess.Popen(self._java("kafka.Kafka", str(self.properties), heap="768m"),
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        atexit.register(self.kill)  # a broker never outlives the process that started it
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited with {self.process.returncode}; its log "
                                   f"({self.workdir / 'broker.out'}):\n{log_tail(self.workdir / 'broker.out')}")
            if self._ready():
                return self
            time.sleep(0.3)
        self.kill()
        raise RuntimeError(f"the Kafka broker did not answer on {self.bootstrap} within {START_TIMEOUT_S:.0f} s; its "
                           f"log:\n{log_tail(self.workdir / 'broker.out')}")

    def _client_conf(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "logger": log}

    def _ready(self) -> bool:
        from confluent_kafka.admin import AdminClient

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                pass
        except OSError:
            return False
        try:
            AdminClient(self._client_conf()).list_topics(timeout=2)
            return True
        except Exception:
            return False

    def stop(self) -> None:
        stop_group(self.process, 30)
        self.process = None

    def kill(self) -> None:
        kill_group(self.process)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    # -- helpers for tests and benchmarks ---------------------------------------------------------

    def admin(self):
        """One admin client per broker (a client dropped while a request runs cancels it)."""
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(self._client_conf())
        return self._admin

    def create_topic(self, topic: str, partitions: int, config: dict[str, str] | None = None) -> None:
        from confluent_kafka.admin import NewTopic

        futures = self.admin().create_topics([NewTopic(topic, partitions, 1, config=config or {})])
        futures[topic].result(30)
        self._wait_for(lambda: len(self.admin().list_topics(topic, timeout=5).topics[topic].partitions) == partitions)

    def add_partitions(self, topic: str, total: int) -> None:
        from confluent_kafka.admin import NewPartitions

        self.admin().create_partitions([NewPartitions(topic, total)])[topic].result(30)
        self._wait_for(lambda: len(self.admin().list_topics(topic, timeout=5).topics[topic].partitions) == total)

    def delete_topic(self, topic: str) -> None:
        self.admin().delete_topics([topic])[topic].result(30)

    def producer(self, **conf: str):
        from confluent_kafka import Producer

        return Producer({"bootstrap.servers": self.bootstrap, "linger.ms": "5", "logger": log, **conf})

    def records(self, topic: str, isolation: str = "read_committed") -> dict[str, list[tuple[int, bytes | None]]]:
        """Every record of the topic, as ``{"<topic>-<partition>": [(offset, value), ...]}``, read with a plain
        consumer up to each partition's end: what a query of the topic must hold, record by record."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "regional-check", "logger": log,
                             "enable.auto.commit": False, "isolation.level": isolation,
                             "enable.partition.eof": True})
        try:
            parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
            out: dict[str, list[tuple[int, bytes | None]]] = {}
            for p in parts:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                got: list[tuple[int, bytes | None]] = []
                if high > low:
                    consumer.assign([TopicPartition(topic, p, low)])
                    done, deadline = False, time.monotonic() + 30
                    while not done and time.monotonic() < deadline:
                        for m in consumer.consume(500, timeout=0.5):
                            error = m.error()
                            if error is not None:
                                done = done or error.code() == KafkaError._PARTITION_EOF
                                continue
                            got.append((int(m.offset() or 0), m.value()))
                    assert done, f"could not read {topic}-{p} to its end"
                out[f"{topic}-{p}"] = got
            return out
        finally:
            consumer.close()

    @staticmethod
    def _wait_for(check, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except Exception:
                pass
            time.sleep(0.2)
        raise TimeoutError("Kafka metadata did not settle")


def topic_messages(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[dict[str, Any]]:
    """Every record of ``topic`` (all partitions, to their end) as a consumer with ``isolation`` reads it, partition
    by partition in order: ``{partition, offset, key, value, headers}`` (headers: a list of ``(key, value)``); []
    when there is no such topic. What tests and checkers count records with."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "regional-check", "logger": log,
                         "enable.auto.commit": False, "isolation.level": isolation, "enable.partition.eof": True})
    out: list[dict[str, Any]] = []
    try:
        listed = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if listed is None or listed.error is not None:
            return []
        for p in sorted(listed.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            done, deadline = False, time.monotonic() + 60
            while not done and time.monotonic() < deadline:
                message: Any
                for message in consumer.consume(500, timeout=0.5):
                    error = message.error()
                    if error is not None:
                        done = done or error.code() == KafkaError._PARTITION_EOF
                        continue
                    out.append({"partition": p, "offset": message.offset(), "key": message.key(),
                                "value": message.value(), "headers": list(message.headers() or [])})
            if not done:
                raise TimeoutError(f"could not read {topic}-{p} to its end")
    finally:
        consumer.close()
    return out


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is no TCP port (0-65535; 0: any free one)")
    return port


def _stop_on_signal(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # a closed terminal (SIGHUP) or a kill (SIGTERM) stops the broker as Ctrl-C does


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m regional.testing.kafka_broker",
        description="Run one Kafka broker (KRaft, no Docker) on 127.0.0.1 until Ctrl-C, to try regional's Kafka "
                    "examples. Its jars are fetched with Maven on first use; its data is removed when it stops.")
    parser.add_argument("--port", type=_port, default=9092, help="the port clients connect to (default 9092)")
    parser.add_argument("--partitions", type=int, default=2,
                        help="partitions of a topic created on first use (default 2: two regions)")
    args = parser.parse_args(argv)
    if args.partitions < 1:
        parser.error("--partitions must be at least 1")
    try:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker binds it
            probe.bind(("127.0.0.1", args.port))
    except OSError as e:
        print(f"cannot listen on 127.0.0.1:{args.port} ({e.strerror}; another broker?): stop what holds it, "
              "or pass --port and use that port in the examples' bootstrap.servers", flush=True)
        return 2
    handlers = {signal.SIGINT: signal.getsignal(signal.SIGINT)}  # _run ignores a second Ctrl-C
    handlers.update((signum, signal.signal(signum, _stop_on_signal)) for signum in (signal.SIGTERM, signal.SIGHUP))
    try:
        return _run(args.port, args.partitions)
    finally:  # main() may be called in a process that goes on (a test)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _run(port: int, partitions: int) -> int:
    with tempfile.TemporaryDirectory(prefix="regional-kafka-") as workdir:
        try:
            broker = KafkaBroker(Path(workdir), partitions=partitions, port=port, auto_create_topics=True)
        except (RuntimeError, subprocess.CalledProcessError) as e:  # no Maven, no jars, a log directory refused
            print(f"cannot set up the broker: {e}", flush=True)
            return 1
        try:
            broker.start()
        except RuntimeError as e:  # says the log's end: the log goes with the directory
            print(e, flush=True)
            return 1
        except KeyboardInterrupt:
            broker.kill()
            return 130
        print(f"Kafka broker on localhost:{broker.port} (bootstrap.servers); topics are created on first use with "
              f"{partitions} partitions. Ctrl-C stops it.", flush=True)
        process = broker.process
        assert process is not None
        try:
            code = process.wait()
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
            broker.stop()
            return 0
        print(f"the broker exited with {code}:\n{log_tail(Path(workdir) / 'broker.out')}", flush=True)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
