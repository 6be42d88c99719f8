"""What a person sees in the terminal of a script that runs regional queries (issue 58): Ctrl-C and a query's
failure each give one line from regional, first, and no py4j or Spark traceback.

- **Ctrl-C** (and SIGTERM, with its own line and exit status 143): pyspark's own SIGINT handler calls into the JVM
  (``cancelAllJobs``) while the main thread is inside a
  py4j call (``awaitTermination``), and py4j logs two tracebacks (``reentrant call inside BufferedReader``). Ours
  says what happens, stops the registered sessions' queries as ``regional.stop`` does (a final epoch) in a thread
  of its own, within ``STOP_ON_SIGNAL_S``, and raises ``KeyboardInterrupt`` in the main thread; Python waits for
  that thread before it exits (``threading``'s exit hooks, which run before pyspark's ``atexit`` ends the JVM).
  A second Ctrl-C quits at once. A query stopped any other way, or not at all, is safe too: it goes on where it
  stopped when started again on its checkpointLocation. The stop runs in another thread because py4j pins a
  connection to each Python thread, and the main thread's is busy with the call the signal interrupted.
- **A query that fails with a regional error**: the exception Spark raises holds regional's sentence in the middle
  of ``[PYTHON_DATA_SOURCE_ERROR]``, a Python traceback and the query's offsets. ``sys.excepthook`` prints
  ``regional: <the sentence>`` instead, once (the listener may have told it already when the query stopped), and
  ``REGIONAL_TRACEBACK=1`` prints Spark's whole error as well. Other exceptions print as they always do.

Installed by ``register`` in the main thread of a classic or Spark Connect session; never in Python workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import Any

from regional.errors import RegionalError

STOP_ON_SIGNAL_S = 10.0  # a final epoch for the queries, at most; under the grace of service managers (k8s: 30 s)
STOP_ON_SIGNAL_ENV = "REGIONAL_STOP_ON_SIGNAL_S"  # another bound, in seconds (0 to 3600)
_SAFE = ("Start them again with the same checkpointLocation and each goes on where it stopped, nothing lost or "
         "published twice (docs/stopping.md).")


def stop_on_signal_s() -> float:
    """The bound on the stop at a signal: ``REGIONAL_STOP_ON_SIGNAL_S`` where set to a number of seconds from 0
    to 3600, else ``STOP_ON_SIGNAL_S``."""
    try:
        value = float(os.environ.get(STOP_ON_SIGNAL_ENV, ""))
    except ValueError:
        return STOP_ON_SIGNAL_S
    return value if 0.0 <= value <= 3600.0 else STOP_ON_SIGNAL_S


def signal_line(signum: int, bound_s: float) -> str:
    if signum == signal.SIGINT:
        return (f"regional: interrupted (Ctrl-C): stopping the queries (a final epoch, at most {bound_s:.0f} s; "
                f"Ctrl-C again to quit at once). {_SAFE}")
    return f"regional: terminated (SIGTERM): stopping the queries (a final epoch, at most {bound_s:.0f} s). {_SAFE}"


INTERRUPTED = signal_line(signal.SIGINT, STOP_ON_SIGNAL_S)
TERMINATED = signal_line(signal.SIGTERM, STOP_ON_SIGNAL_S)
TRACEBACK_ENV = "REGIONAL_TRACEBACK"

# ``regional.errors.RegionalStoreError: <sentence>`` inside a JVM exception's message (a Python traceback's line)
_REGIONAL_LINE = re.compile(r"regional\.errors\.(Regional\w*Error): ([^\n]+)")
_lock = threading.Lock()
_told: set[str] = set()
_state = {"installed": False, "interrupted": False}
# What the stop on a signal works with, one entry a registered session: its active queries, and how to stop one
# within a number of seconds (regional.stop for a regional query; ``register`` passes both).
QueryStopper = Callable[[Any, float], None]
_sessions: list[tuple[Callable[[], Sequence[Any]], QueryStopper]] = []
_stopping: list[threading.Thread] = []


def regional_message(error: BaseException | str) -> str | None:
    """regional's own sentence in an error, or None when it holds none: a ``RegionalError`` raised here, or the
    last ``regional.errors.Regional...Error: ...`` line of a Spark error's text (the exception the traceback ends
    with; an error class suffix ``SQLSTATE: ...`` left out)."""
    if isinstance(error, RegionalError):
        return str(error)
    found = _REGIONAL_LINE.findall(str(error))
    if not found:
        return None
    return re.sub(r"\s*SQLSTATE: \w+\s*$", "", found[-1][1]).strip() or None


def tell_once(message: str, key: str | None = None) -> bool:
    """Print ``regional: <message>`` on stderr unless ``key`` (default: the message) was told already; True when
    printed now."""
    with _lock:
        if (key or message) in _told:
            return False
        _told.add(key or message)
    sys.stderr.write(f"regional: {message}\n")
    sys.stderr.flush()
    return True


class _QuietAfterInterrupt(logging.Filter):
    """py4j logs on the root logger when an interrupted call breaks its connection: not news after Ctrl-C."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_state["interrupted"] and "while sending command" in record.getMessage())


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    if _state["interrupted"]:  # a second signal: quit now, without waiting for the stop (the JVM ends with us)
        if any(t.is_alive() for t in _stopping):
            for stream in (sys.stdout, sys.stderr):  # what the script printed, kept
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(128 + signum)
    else:
        _state["interrupted"] = True
        logging.getLogger("py4j").setLevel(logging.CRITICAL + 1)  # its connections break as the JVM goes
        bound_s = stop_on_signal_s()
        sys.stderr.write(signal_line(signum, bound_s) + "\n")
        sys.stderr.flush()
        _start_stopping(time.monotonic() + bound_s)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)  # as a process killed by SIGTERM reports it; atexit handlers still run


def _start_stopping(deadline: float) -> None:
    """Stops every registered session's active queries in a thread (daemon: a stop that hangs must not keep the
    process), which Python's exit waits for until ``deadline`` and a few seconds for Spark's own stop."""
    if not _sessions:
        return
    thread = threading.Thread(target=_stop_queries, args=(deadline,), name="regional-stop-on-signal", daemon=True)
    register = getattr(threading, "_register_atexit", None)  # before the threads that are not daemons are joined
    try:
        if register is not None:
            register(lambda: thread.join(max(0.0, deadline - time.monotonic()) + 5.0))
    except RuntimeError:  # the interpreter is already shutting down: nothing to wait in
        return
    _stopping.append(thread)
    thread.start()


def _stop_queries(deadline: float) -> None:
    for active, stop in list(_sessions):
        try:
            queries = list(active())
        except Exception:  # the session or its JVM is gone already (SIGTERM to the whole process group)
            continue
        for query in queries:
            try:
                stop(query, max(0.0, deadline - time.monotonic()))
            except Exception:  # the query ends with the process anyway: nothing to add to the line already said
                pass


def _excepthook(previous: Callable[[type[BaseException], BaseException, TracebackType | None], object]
                ) -> Callable[[type[BaseException], BaseException, TracebackType | None], None]:
    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt) and _state["interrupted"]:
            return  # said when it came
        message = regional_message(error)
        if message is None or os.environ.get(TRACEBACK_ENV) == "1":
            previous(kind, error, tb)
        if message is not None:
            tell_once(message, key=message)
    return hook


def install(active_queries: Callable[[], Sequence[Any]] | None = None, stop: QueryStopper | None = None) -> None:
    """Our Ctrl-C handler (in place of pyspark's, or Python's default) and excepthook; once, main thread only, and
    never over a handler the script installed itself. ``active_queries`` and ``stop``: a session's, for the stop
    on a signal (each registered session once)."""
    if active_queries is not None and stop is not None:
        _sessions.append((active_queries, stop))
    if _state["installed"] or threading.current_thread() is not threading.main_thread():
        return
    _state["installed"] = True
    current = signal.getsignal(signal.SIGINT)
    theirs = getattr(current, "__module__", "") or ""
    # Not in a REPL or a notebook: there Ctrl-C interrupts one statement and the session lives on, with its
    # queries (pyspark's own handler cancels the running jobs, as it always did)
    if (current is signal.default_int_handler or theirs.startswith("pyspark")) and not _interactive():
        signal.signal(signal.SIGINT, _on_interrupt)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a service manager's stop, a kill: the same, one line
        signal.signal(signal.SIGTERM, _on_interrupt)
    logging.getLogger().addFilter(_QuietAfterInterrupt())
    sys.excepthook = _excepthook(sys.excepthook)
    _quiet_accumulator_server()


def _interactive() -> bool:
    """A REPL (``python -i``, the pyspark shell) or IPython/Jupyter: the process outlives a Ctrl-C."""
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return True
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


def _quiet_accumulator_server() -> None:
    """pyspark's accumulator server (a thread of this process, fed by the JVM) prints a traceback when the JVM goes
    away first, as it does at Ctrl-C: the end of its peer, not news."""
    try:
        from pyspark import accumulators
    except ImportError:  # a Spark Connect client has none
        return
    for server in (getattr(accumulators, "AccumulatorTCPServer", None),
                   getattr(accumulators, "AccumulatorUnixServer", None)):
        original = getattr(server, "handle_error", None)
        if server is None or original is None or getattr(original, "regional_quiet", False):
            continue
        server.handle_error = _quiet_handle_error(original)


def _quiet_handle_error(original: Callable[..., None]) -> Callable[..., None]:
    def handle_error(self: object, request: object, client_address: object) -> None:
        if _state["interrupted"] or isinstance(sys.exc_info()[1], EOFError | ConnectionResetError | BrokenPipeError):
            return
        original(self, request, client_address)

    handle_error.regional_quiet = True  # type: ignore[attr-defined]
    return handle_error
