"""pyspark's real daemon (pyspark/daemon.py, no JVM: this test plays Spark's side of the Unix domain socket) with
and without regional's quiet worker (pyspark_regional): an idle worker whose socket Spark closes ends without a
traceback; a task's real error still reaches Spark over the socket, as before."""

from __future__ import annotations

import os
import pkgutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

import pytest

# The daemon as Spark starts it (python -m pyspark.daemon pyspark.worker), in a process where, with ``quiet``,
# every forked worker installs the quiet worker as a worker does when it imports regional.
LAUNCH = """
import os, runpy, sys
sys.argv = ["pyspark.daemon", "pyspark.worker"]
if {quiet}:
    import pyspark_regional
    os.register_at_fork(after_in_child=pyspark_regional.quiet_idle_workers)
runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
"""


class Daemon:
    def __init__(self, quiet: bool) -> None:
        self.directory = tempfile.mkdtemp(prefix="d", dir="/tmp")  # a short path: AF_UNIX
        env = {**os.environ, "PYTHON_UNIX_DOMAIN_ENABLED": "true", "PYTHON_WORKER_FACTORY_SOCK_DIR": self.directory,
               "SPARK_REUSE_WORKER": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
        self.process = subprocess.Popen([sys.executable, "-c", LAUNCH.format(quiet=quiet)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert self.process.stdout is not None
        length = struct.unpack(">i", self.process.stdout.read(4))[0]
        self.path = self.process.stdout.read(length).decode()

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(self.path)
        sock.settimeout(60)
        struct.unpack(">i", sock.recv(4))  # the forked worker's pid: the fork succeeded
        return sock

    def stop(self) -> str:
        """As Spark stops the daemon (closes its stdin); what the daemon and its workers printed."""
        assert self.process.stdin is not None and self.process.stderr is not None
        self.process.stdin.close()
        self.process.wait(60)
        return self.process.stderr.read().decode(errors="replace")


def idle_worker_closed(quiet: bool) -> str:
    daemon = Daemon(quiet)
    sock = daemon.connect()
    time.sleep(0.5)  # the worker waits for its first task
    sock.close()  # Spark closes an idle worker (spark.stop(), or its idle timeout)
    time.sleep(1.0)
    return daemon.stop()


def test_pyspark_alone_prints_a_broken_pipe_traceback_for_an_idle_worker_spark_closes():
    """The wart itself, at its source (if pyspark stops printing it, this test says so)."""
    printed = idle_worker_closed(quiet=False)
    assert "BrokenPipeError" in printed and "Traceback" in printed, printed


def test_with_the_quiet_worker_an_idle_worker_spark_closes_prints_nothing():
    printed = idle_worker_closed(quiet=True)
    assert printed.strip() == "", printed


@pytest.mark.parametrize("quiet", [False, True])
def test_a_tasks_real_error_still_reaches_spark(quiet):
    """A task pyspark's worker cannot run (here: Spark names another Python version) is reported to Spark over the
    socket, as pyspark does: PYTHON_EXCEPTION_THROWN (-2), then the error's text."""
    daemon = Daemon(quiet)
    sock = daemon.connect()
    version = b"2.7"
    sock.sendall(struct.pack(">i", 0) + struct.pack(">i", len(version)) + version)  # split index, Python version
    received = b""
    while len(received) < 8 or len(received) < 8 + struct.unpack(">i", received[4:8])[0]:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    sock.close()
    printed = daemon.stop()
    assert struct.unpack(">i", received[:4])[0] == -2, received[:200]
    assert b"Python in worker has different version" in received, received[:2000]
    assert "BrokenPipeError" not in printed, printed


def test_pysparks_data_source_lookup_finds_the_module():
    """pyspark.sql.worker.lookup_data_sources imports every top-level pyspark_* module: the lookup's own worker
    imports it, though no regional code runs there; it declares no data source."""
    import pyspark_regional

    assert "pyspark_regional" in {m.name for m in pkgutil.iter_modules()}
    assert not hasattr(pyspark_regional, "DefaultSource")
    assert pyspark_regional.quiet_idle_workers() is False  # not in a daemon's worker: nothing changes
