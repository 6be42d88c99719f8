"""Run a driver in a child process and SIGKILL its whole process tree at a fail-point or after a delay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path


def run_killable(args: list[str], failpoint: str | None, marker: Path, timeout: float = 240,
                 kill_after: float | None = None, cwd: Path | None = None,
                 armed: Callable[[], bool] | None = None) -> str:
    """Run ``python -m <args>`` in its own process group; SIGKILL the group (driver, JVM, Python workers) when
    it reaches ``failpoint`` (it writes ``marker``) or ``kill_after`` seconds after it started (or, with
    ``armed``, after ``armed()`` first held). Returns "killed" or "finished" (a child that fails is an
    assertion error with its output)."""
    # A marker of its own: Python workers of an earlier killed run (pyspark's daemon runs them in a process
    # group of their own; they die a moment later) may still reach a fail-point and write theirs.
    marker = marker.with_name(f"{marker.name}.{uuid.uuid4().hex}")
    env = dict(os.environ)
    env.pop("REGIONAL_FAILPOINT", None)
    if failpoint:
        env["REGIONAL_FAILPOINT"] = failpoint
        env["REGIONAL_FAILPOINT_FILE"] = str(marker)
    child = subprocess.Popen([sys.executable, "-m", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    started = time.monotonic()
    clock: float | None = started if armed is None else None
    try:
        while time.monotonic() < started + timeout:
            if clock is None and armed is not None and armed():
                clock = time.monotonic()
            due = kill_after is not None and clock is not None and time.monotonic() > clock + kill_after
            if (failpoint and marker.exists()) or due:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                return "killed"
            if child.poll() is not None:
                output = child.stdout.read() if child.stdout else ""
                assert child.returncode == 0, f"child failed:\n{output[-4000:]}"
                return "finished"
            time.sleep(0.05)
        raise AssertionError(f"child neither reached {failpoint} nor finished in {timeout}s")
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
