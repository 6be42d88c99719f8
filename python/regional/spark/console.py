"""What a person sees in the terminal of a script that runs regional queries (issue 58): Ctrl-C and a query's
failure each give one line from regional, first, and no py4j or Spark traceback.

- **Ctrl-C** (and SIGTERM, with its own line and exit status 143): pyspark's own SIGINT handler calls into the JVM
  (``cancelAllJobs``) while the main thread is inside a
  py4j call (``awaitTermination``), and py4j logs two tracebacks (``reentrant call inside BufferedReader``). Ours
  only says what happens and raises ``KeyboardInterrupt``; a second Ctrl-C interrupts at once. The queries end with
  the process, as a kill ends them: each goes on where it stopped when started again on its checkpointLocation.
- **A query that fails with a regional error**: the exception Spark raises holds regional's sentence in the middle
  of ``[PYTHON_DATA_SOURCE_ERROR]``, a Python traceback and the query's offsets. ``sys.excepthook`` prints
  ``regional: <the sentence>`` instead, once (the listener may have told it already when the query stopped), and
  ``REGIONAL_TRACEBACK=1`` prints Spark's whole error as well. Other exceptions print as they always do.

Installed by ``register`` in the main thread of a classic or Spark Connect session; never in Python workers.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

from regional.errors import RegionalError

INTERRUPTED = ("regional: interrupted (Ctrl-C): the queries stop with this process. Start them again with the same "
               "checkpointLocation and each goes on where it stopped, nothing lost or published twice "
               "(docs/troubleshooting.md, \"Ctrl-C, a kill, a crash\"). Ctrl-C again to quit at once.")
TERMINATED = ("regional: terminated (SIGTERM): the queries stop with this process. Start them again with the same "
              "checkpointLocation and each goes on where it stopped, nothing lost or published twice "
              "(docs/troubleshooting.md, \"Ctrl-C, a kill, a crash\").")
TRACEBACK_ENV = "REGIONAL_TRACEBACK"

# ``regional.errors.RegionalStoreError: <sentence>`` inside a JVM exception's message (a Python traceback's line)
_REGIONAL_LINE = re.compile(r"regional\.errors\.(Regional\w*Error): ([^\n]+)")
_lock = threading.Lock()
_told: set[str] = set()
_state = {"installed": False, "interrupted": False}


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
    if not _state["interrupted"]:
        _state["interrupted"] = True
        logging.getLogger("py4j").setLevel(logging.CRITICAL + 1)  # its connections break as the JVM goes
        sys.stderr.write((INTERRUPTED if signum == signal.SIGINT else TERMINATED) + "\n")
        sys.stderr.flush()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)  # as a process killed by SIGTERM reports it; atexit handlers still run


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


def install() -> None:
    """Our Ctrl-C handler (in place of pyspark's, or Python's default) and excepthook; once, main thread only, and
    never over a handler the script installed itself."""
    if _state["installed"] or threading.current_thread() is not threading.main_thread():
        return
    _state["installed"] = True
    current = signal.getsignal(signal.SIGINT)
    theirs = getattr(current, "__module__", "") or ""
    if current is signal.default_int_handler or theirs.startswith("pyspark"):
        signal.signal(signal.SIGINT, _on_interrupt)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a service manager's stop, a kill: the same, one line
        signal.signal(signal.SIGTERM, _on_interrupt)
    logging.getLogger().addFilter(_QuietAfterInterrupt())
    sys.excepthook = _excepthook(sys.excepthook)
    _quiet_accumulator_server()


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
