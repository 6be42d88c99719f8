"""A Spark standalone cluster on 127.0.0.1 for tests: a master and workers started with pyspark's own
``bin/spark-class`` (pip's pyspark has no start-master.sh), each worker running executors for the apps that
connect; executors and whole workers can be SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from regional.spark.connect import spark_home
from regional.testing.kafka_broker import free_port
from regional.testing.processes import process_table

START_TIMEOUT_S = 90.0


class StandaloneCluster:
    def __init__(self, workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g",
                 private_dirs: list[Path] | None = None) -> None:
        """``private_dirs``: directories the workers (and their executors) must not see. Each worker then runs in
        a mount namespace of its own (``unshare --mount``, as root) with an empty tmpfs over each of them: what
        the driver and the test write there does not reach the executors, which see only what they are sent
        (and object storage). The worker's own directories may be under them: they land on its tmpfs."""
        self.private_dirs = [Path(d) for d in private_dirs or []]
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.count, self.cores, self.memory = workers, cores, memory
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []

    def _env(self) -> dict[str, str]:
        return {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_LOG_DIR": str(self.workdir / "logs"), "SPARK_WORKER_DIR": str(self.workdir / "work")}

    def _spawn(self, name: str, *args: str, private: bool = False) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")
        command = [str(spark_home() / "bin" / "spark-class"), *args]
        if private and self.private_dirs:
            mounts = " && ".join(f'mount -t tmpfs tmpfs "${i + 1}"' for i in range(len(self.private_dirs)))
            script = f'{mounts} && shift {len(self.private_dirs)} && exec "$@"'
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                       *map(str, self.private_dirs), *command]
        return subprocess.Popen(command, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def start(self) -> StandaloneCluster:
        self.master = self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                  "--port", str(self.port), "--webui-port", str(self.ui_port))
        self._wait(lambda: self.state() is not None, "the master to start")
        for i in range(self.count):
            self.add_worker(i)
        self._wait(lambda: len(self.alive_workers()) == self.count, f"{self.count} workers to register")
        return self

    def add_worker(self, i: int) -> None:
        self.workers.append(self._spawn(
            f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
            "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(free_port()),
            "--work-dir", str(self.workdir / f"work-{i}"), private=True))

    def state(self) -> dict | None:
        """The master's JSON status page, or None while it does not answer with it (while it starts, its web UI
        has answered ``/json/`` with an HTML page: seen once in a fresh-clone run)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as reply:
                found = json.load(reply)
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def alive_workers(self) -> list[dict]:
        state = self.state() or {}
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def executor_pids(self, worker: int | None = None) -> list[int]:
        """Executor JVMs (CoarseGrainedExecutorBackend) run by our workers (all, or worker ``worker``'s)."""
        parents = {p.pid for i, p in enumerate(self.workers) if worker is None or i == worker}
        return [p.pid for p in process_table().values()
                if p.ppid in parents and "CoarseGrainedExecutorBackend" in p.cmdline]

    def kill_executor(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    def kill_worker(self, i: int) -> None:
        """The worker lost for good: its JVM and its executors, SIGKILLed."""
        self._kill(self.executor_pids(i), [self.workers[i]])

    def stop(self) -> None:
        self._kill(self.executor_pids(), [*self.workers, *([self.master] if self.master else [])])

    @staticmethod
    def _kill(executors: list[int], processes: list[subprocess.Popen[bytes]]) -> None:
        """Executors (found before their workers die: they are found as the workers' children) and the
        process groups of workers or the master, all SIGKILLed."""
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for pid in executors:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    @staticmethod
    def _wait(check, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.5)
