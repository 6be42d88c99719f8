"""regional's hook into pyspark's Python workers: idle workers end without a word.

pyspark's daemon (pyspark/daemon.py) forks one worker per connection and, with worker reuse (Spark's default),
runs task after task in it. Spark closes an idle worker's socket at ``spark.stop()`` and when the worker has been
idle past its idle timeout. The worker then reads end-of-file where its next task would begin, treats that as a
failed task, writes the error back to the closed socket and exits. Over loopback TCP that last write lands in the
kernel's buffer and nothing is printed; over a Unix domain socket (regional's local sessions use them) it fails at
once, and the daemon prints a ``BrokenPipeError`` traceback for every such worker (``manager`` calls
``traceback.print_exc()`` when ``worker``'s final ``outfile.flush()`` raises). Nothing went wrong: nobody was
waiting for that worker.

``quiet_idle_workers`` makes the daemon's loop, in the worker process it runs in, wait for the first byte of the
next task first (where pyspark's worker would block reading it anyway); when the socket ends instead, the worker
leaves the loop and exits, quietly. Everything else is pyspark's own: a task that runs and fails still reports its
error to Spark, which shows it to the user.

It runs wherever this module is imported in a worker forked by pyspark's daemon: regional imports it (so every
worker that runs regional's source or sink, or unpickles its data source while planning, is covered), and
pyspark's data source lookup imports every top-level module named ``pyspark_*`` (its ``lookup_data_sources``
worker is one no regional code runs in otherwise). It declares no data source: regional's is registered by
``regional.register``. Plain Python, no imports of regional or pyarrow: the lookup imports it in every session.
"""

from __future__ import annotations

import signal
import socket
import sys
from types import ModuleType
from typing import Any


def _quiet(pyspark_worker: Any) -> Any:
    def worker(sock: socket.socket, authenticated: bool) -> int:
        # As pyspark's worker does first: this process dies with its daemon (SIGHUP) and on SIGTERM while it waits.
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            next_task = sock.recv(1, socket.MSG_PEEK)
        except OSError:  # reset by Spark: the same end
            next_task = b""
        if not next_task:
            return 1  # not 0: the daemon's child then leaves its reuse loop and exits
        return int(pyspark_worker(sock, authenticated))

    worker.regional_quiet = True  # type: ignore[attr-defined]
    return worker


def install(daemon: ModuleType) -> bool:
    """Make ``daemon`` (pyspark's daemon module) use the quiet worker: ``manager`` looks ``worker`` up in its module
    at each turn of a forked worker's loop. Whether it was installed now."""
    current = getattr(daemon, "worker", None)
    if current is None or not callable(getattr(daemon, "manager", None)) or getattr(current, "regional_quiet", False):
        return False
    daemon.worker = _quiet(current)  # type: ignore[attr-defined]
    return True


def quiet_idle_workers() -> bool:
    """In a process forked by pyspark's daemon (``python -m pyspark.daemon``, so the daemon is ``__main__``):
    install the quiet worker into the daemon's loop this process runs on after its current task. Elsewhere
    (a driver, a test) nothing changes. Whether it was installed now."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) != "pyspark.daemon" or main is None:
        return False
    return install(main)


# pyspark's long-lived runners of a Python streaming source (one per query, started by the driver's JVM): when the
# JVM goes away (a Ctrl-C, a kill, the end of the script) the runner's next read or write fails and Python prints
# the EOFError/BrokenPipeError chain on the terminal. Its only peer is gone: nobody waits for it.
_RUNNERS = ("pyspark.sql.streaming.python_streaming_source_runner",)
_PEER_GONE = (EOFError, BrokenPipeError, ConnectionResetError)


def quiet_runner_when_spark_is_gone() -> bool:
    """In a streaming source runner: end without a traceback when the JVM is gone. Whether it was installed now."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) not in _RUNNERS or \
            getattr(sys.excepthook, "regional_quiet", False):
        return False
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        if not issubclass(kind, _PEER_GONE):
            previous(kind, error, tb)

    hook.regional_quiet = True  # type: ignore[attr-defined]
    sys.excepthook = hook
    return True


quiet_idle_workers()
quiet_runner_when_spark_is_gone()
