"""``python -m regional.testing.kafka_broker`` (the getting-started page's local broker): its refusals. Starting
one is the integration suite's (every Kafka test starts a ``KafkaBroker``)."""

from __future__ import annotations

import signal
import socket

from regional.testing import kafka_broker


def test_a_port_in_use_is_refused_before_any_jar_is_fetched(capsys, monkeypatch):
    def no_fetch(*_args, **_kwargs):
        raise AssertionError("fetched the broker's jars for a port in use")

    monkeypatch.setattr(kafka_broker, "broker_jars", no_fetch)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert kafka_broker.main(["--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().out


def test_no_maven_is_one_line_that_says_what_to_install(capsys, monkeypatch):
    def no_maven(*_args, **_kwargs):
        raise RuntimeError("the jars of kafka-4.1.1 are fetched with Maven: install Maven (apt-get install maven)")

    monkeypatch.setattr(kafka_broker, "broker_jars", no_maven)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    assert kafka_broker.main(["--port", str(port)]) == 1
    assert {signum: signal.getsignal(signum) for signum in before} == before  # this process goes on
    assert "cannot set up the broker: the jars of kafka-4.1.1 are fetched with Maven" in capsys.readouterr().out
