"""The terminal's view of a regional script (issue 58), without Spark: regional's sentence found in Spark's error
text, told once; Ctrl-C's handler says what happens and raises KeyboardInterrupt; everything else prints as ever."""

from __future__ import annotations

import io
import signal
import sys

import pytest

from regional.errors import RegionalStoreError
from regional.spark import console

SPARK_TEXT = """[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [PYTHON_STREAMING_DATA_SOURCE_\
RUNTIME_ERROR] Failed when Python streaming data source perform latestOffset: Traceback (most recent call last):
  File "/x/regional/spark/reader.py", line 196, in latestOffset
regional.errors.RegionalStoreError: region 'a' now ends at offset 0: its input must be append-only SQLSTATE: 38000

=== Streaming Query ===
Identifier: [id = 1, runId = 2]
Current Committed Offsets: {...}"""


@pytest.fixture(autouse=True)
def _console_of_its_own(monkeypatch):
    """Each test sees no registered session and no stop under way (a session registered earlier in the same
    process, by an integration test, would otherwise be stopped, and a second signal would end the process)."""
    monkeypatch.setattr(console, "_sessions", [])
    monkeypatch.setattr(console, "_stopping", [])
    monkeypatch.setattr(console, "_state", {"installed": True, "interrupted": False})


def test_regional_sentence_is_found_in_sparks_error_text_or_nothing():
    assert console.regional_message(SPARK_TEXT) == "region 'a' now ends at offset 0: its input must be append-only"
    assert console.regional_message(RegionalStoreError("the store is gone")) == "the store is gone"
    assert console.regional_message("ValueError: cannot parse x\nTraceback ...") is None
    assert console.regional_message(ValueError("regional said so")) is None


def test_the_excepthook_tells_regional_errors_once_and_leaves_others_to_the_previous_hook(monkeypatch):
    seen, err = [], io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(console, "_told", set())
    hook = console._excepthook(lambda kind, error, tb: seen.append(kind))
    error = RuntimeError(SPARK_TEXT)
    hook(RuntimeError, error, None)
    hook(RuntimeError, error, None)  # the listener, or a second raise: told already
    assert err.getvalue().splitlines() == ["regional: region 'a' now ends at offset 0: its input must be append-only"]
    assert seen == []  # no traceback
    hook(ValueError, ValueError("x"), None)
    assert seen == [ValueError]
    monkeypatch.setenv(console.TRACEBACK_ENV, "1")
    hook(RuntimeError, RuntimeError(SPARK_TEXT.replace("offset 0", "offset 9")), None)
    assert seen == [ValueError, RuntimeError] and err.getvalue().count("regional: ") == 2


def test_ctrl_c_says_what_happens_once_and_interrupts(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setitem(console._state, "interrupted", False)
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            console._on_interrupt(signal.SIGINT, None)
    assert err.getvalue() == console.INTERRUPTED + "\n"
    quiet = console._excepthook(lambda *a: pytest.fail("printed a KeyboardInterrupt traceback"))
    quiet(KeyboardInterrupt, KeyboardInterrupt(), None)


def test_sigterm_says_so_once_and_exits_with_143(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setitem(console._state, "interrupted", False)
    with pytest.raises(SystemExit) as stopped:
        console._on_interrupt(signal.SIGTERM, None)
    assert stopped.value.code == 143 and err.getvalue() == console.TERMINATED + "\n"


def test_a_signal_stops_each_registered_sessions_queries_in_a_thread_within_the_bound(monkeypatch):
    """The stop runs beside the main thread (py4j pins the main thread's connection to the call the signal
    interrupted), with what is left of STOP_ON_SIGNAL_S for each query; a second signal during it quits at once."""
    import threading

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    release = threading.Event()
    stopped: list[tuple[str, float, str]] = []

    def stop(query: str, timeout: float) -> None:
        stopped.append((query, timeout, threading.current_thread().name))
        release.wait(5)

    console.install(lambda: ["q1", "q2"], stop)
    with pytest.raises(KeyboardInterrupt):
        console._on_interrupt(signal.SIGINT, None)
    exits: list[int] = []
    monkeypatch.setattr(console.os, "_exit", lambda code: exits.append(code))
    with pytest.raises(KeyboardInterrupt):  # os._exit, replaced here, would not return
        console._on_interrupt(signal.SIGINT, None)
    assert exits == [130]
    release.set()
    console._stopping[0].join(5)
    assert [q for q, _, _ in stopped] == ["q1", "q2"]
    assert all(0 < t <= console.STOP_ON_SIGNAL_S and name != threading.main_thread().name for _, t, name in stopped)
    exits.clear()  # the thread has ended: a later signal no longer quits at once
    with pytest.raises(KeyboardInterrupt):
        console._on_interrupt(signal.SIGINT, None)
    assert exits == []


def test_a_repl_or_a_notebook_keeps_its_own_ctrl_c(monkeypatch):
    """There Ctrl-C interrupts one statement and the session, with its queries, lives on: no stop, no line."""
    installed: list[object] = []
    monkeypatch.setattr(console.signal, "signal", lambda sig, handler: installed.append((sig, handler)))
    monkeypatch.setattr(console.signal, "getsignal", lambda sig: signal.default_int_handler
                        if sig == signal.SIGINT else signal.SIG_IGN)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    monkeypatch.setitem(console._state, "installed", False)
    console.install()
    assert installed == []
    monkeypatch.delattr(sys, "ps1")
    monkeypatch.setitem(console._state, "installed", False)
    console.install()
    assert installed == [(signal.SIGINT, console._on_interrupt)]


def test_the_stops_bound_is_10_s_or_the_environments(monkeypatch):
    monkeypatch.delenv(console.STOP_ON_SIGNAL_ENV, raising=False)
    assert console.stop_on_signal_s() == 10.0
    for given, bound in (("25", 25.0), ("0", 0.0), ("-1", 10.0), ("a minute", 10.0), ("99999", 10.0)):
        monkeypatch.setenv(console.STOP_ON_SIGNAL_ENV, given)
        assert console.stop_on_signal_s() == bound, given
    monkeypatch.setenv(console.STOP_ON_SIGNAL_ENV, "25")
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with pytest.raises(SystemExit):
        console._on_interrupt(signal.SIGTERM, None)
    assert "at most 25 s" in err.getvalue()
