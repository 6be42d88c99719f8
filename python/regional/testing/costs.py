"""What a test run spends its time on, beyond each test's own duration (docs/testing.md, "Where the time goes"):
the shared servers' and sessions' start-ups, timed, and the processes each test starts, counted by kind.

The repository's root ``conftest.py`` reads both and prints them at the end of every run. Processes are seen
through Python's ``subprocess.Popen`` audit event (PEP 578), so no test or server has to report its own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Kinds of process a test may start, by what its command runs; the first that matches names it.
PROCESS_KINDS: tuple[tuple[str, str], ...] = (
    ("standalone cluster daemon", "org.apache.spark.deploy."),
    ("Spark Connect server", "SparkConnectServer"),
    ("Kafka broker", "kafka.Kafka"),
    ("S3 API server", "s3proxy"),
    ("PostgreSQL server", "pg_ctl"),
    ("a venv for the wheel", "-m venv"),
    ("child driver (kills, restarts, exits)", "integration."),
    ("Maven", "mvn"),
    ("apt-get", "apt-get"),
)

_started: dict[str, list[float]] = {}  # server or session -> seconds of each start-up
_processes: dict[str, int] = {}  # kind -> processes started during the current test


@contextmanager
def start_up(what: str) -> Iterator[None]:
    """Time one start-up of ``what`` (a shared SparkSession, a broker, a database server...)."""
    began = time.monotonic()
    try:
        yield
    finally:
        _started.setdefault(what, []).append(time.monotonic() - began)


def start_ups() -> dict[str, list[float]]:
    return {k: list(v) for k, v in _started.items()}


def process_kind(argv: Sequence[Any]) -> str | None:
    """The kind of an expensive process from its command line, or None for a cheap one."""
    text = " ".join(str(a) for a in argv)
    for kind, needle in PROCESS_KINDS:
        if needle in text:
            return kind
    if argv and Path(str(argv[0])).name.startswith("python") and "-c" in [str(a) for a in argv]:
        return "child driver (kills, restarts, exits)"
    return None


def _on_audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen":
        return
    argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
    kind = process_kind(argv)
    if kind is not None:
        _processes[kind] = _processes.get(kind, 0) + 1


def watch_processes() -> None:
    """Count the processes started from now on (an audit hook stays for the process's life: call it once)."""
    sys.addaudithook(_on_audit)


def take_processes() -> dict[str, int]:
    """The processes started since the last call, by kind; the count starts again."""
    taken = dict(_processes)
    _processes.clear()
    return taken
