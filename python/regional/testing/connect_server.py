"""A real Spark Connect server on 127.0.0.1 for tests: ``regional.spark.connect.server_command`` in its own
process group, started, waited for, SIGKILLed and restarted on the same port (the checkpoint lives on local
disk, so a restarted server's query resumes from it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from regional.spark.connect import server_command, server_env
from regional.testing.kafka_broker import free_port
from regional.testing.processes import log_tail

START_TIMEOUT_S = 120.0


class ConnectServer:
    def __init__(self, workdir: Path, master: str = "local[2,3]", conf: Mapping[str, str] | None = None,
                 pythonpath: list[str] | None = None, without: tuple[str, ...] = ()) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.master = master
        self.conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                     "spark.sql.streaming.noDataMicroBatches.enabled": "false", **(conf or {})}
        self.pythonpath = pythonpath or []
        # entries of spark.jars and spark.sql.extensions left out: a server started as if the user forgot them
        self.without = without
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"server-{self.starts}.log"

    def start(self) -> ConnectServer:
        self.starts += 1
        env = server_env()
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        # the server's Python workers import the tests' targets and UDFs (integration.faults)
        env["PYTHONPATH"] = os.pathsep.join([*self.pythonpath, *filter(None, [env.get("PYTHONPATH")])])
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command(),
                                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._listening():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the Spark Connect server did not start; its log: {self.log_path}\n"
                                   + log_tail(self.log_path))
            time.sleep(0.3)
        return self

    def command(self) -> list[str]:
        command = server_command(self.master, "127.0.0.1", self.port, self.conf)
        kept = []
        for arg in command:
            key, _, value = arg.partition("=")
            if key in ("spark.jars", "spark.sql.extensions"):
                arg = f"{key}={','.join(v for v in value.split(',') if v not in self.without)}"
            kept.append(arg)
        return kept

    def _listening(self) -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def kill(self) -> None:
        """SIGKILL the server and everything it started (its Python workers)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        # the port is free again once the process is gone; the next start binds it
        self.process = None

    def restart(self) -> ConnectServer:
        self.kill()
        return self.start()

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
