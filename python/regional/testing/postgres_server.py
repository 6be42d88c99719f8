"""A real PostgreSQL server on a loopback port, for tests and benchmarks (no Docker).

The server is Debian's ``postgresql`` package, installed with apt the first time if it is missing
(as root). ``PostgresServer`` runs ``initdb`` as the ``postgres`` user (initdb refuses root), starts
``pg_ctl`` on a free port of 127.0.0.1 with ``max_prepared_transactions`` set (it can only be set at
server start), and stops it (``stop``), or kills it (``kill``); ``restart`` keeps the data. A server
never outlives the process that started it.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from regional.testing.debian import ensure
from regional.testing.kafka_broker import free_port

START_TIMEOUT_S = 60.0


def postgres_bin() -> Path:
    """The directory of PostgreSQL's server programs, installed from Debian's packages if missing."""
    def found() -> list[str]:
        return sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))

    ensure(["postgresql"], lambda: bool(found()), "a PostgreSQL server (/usr/lib/postgresql/*/bin/initdb)")
    return Path(found()[-1]).parent


class PostgresServer:
    """One server, superuser ``postgres`` with trust authentication on 127.0.0.1 only."""

    def __init__(self, max_prepared_transactions: int = 64) -> None:
        self.bin = postgres_bin()
        # initdb runs as postgres: the data directory must not be under a directory postgres cannot enter.
        self.root = Path(tempfile.mkdtemp(prefix="regional-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"  # pg_ctl's shell, as postgres, writes it
        self.port = free_port()
        self.max_prepared_transactions = max_prepared_transactions
        self.started = False
        self.root.chmod(0o755)
        if os.geteuid() == 0:
            self._as_postgres("chown", "-R", "postgres", str(self.root), as_root=True)
        self._as_postgres(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                          "-E", "UTF8", "--locale=C")

    def _as_postgres(self, *args: str, as_root: bool = False, check: bool = True) -> subprocess.CompletedProcess:
        command = list(args) if as_root or os.geteuid() != 0 else ["runuser", "-u", "postgres", "--", *args]
        return subprocess.run(command, check=check, capture_output=True, text=True)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> PostgresServer:
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                   f"-c max_prepared_transactions={self.max_prepared_transactions} -c fsync=off "
                   "-c max_connections=100")
        done = self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o",
                                 options, "-w", "-t", str(int(START_TIMEOUT_S)), "start", check=False)
        if done.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not start ({done.stderr.strip() or done.stdout.strip()}); see "
                               f"{self.log}")
        self.started = True
        atexit.register(self.kill)
        return self

    def stop(self) -> None:
        if self.started:
            self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop",
                              check=False)
            self.started = False

    @property
    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """SIGKILL the postmaster (its children exit when they notice); the data directory stays."""
        pid_file = self.data / "postmaster.pid"
        if self.started and (pid := self.postmaster_pid) is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 10
            while pid_file.exists() and time.monotonic() < deadline:
                # the postmaster is gone; its backends leave within a moment, then pg_ctl can start again
                if self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "status",
                                     check=False).returncode != 0:
                    break
                time.sleep(0.1)
        self.started = False

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def connect(self, **kwargs):
        import psycopg

        return psycopg.connect(self.url, autocommit=True, **kwargs)
