"""Debian packages the tests need (a PostgreSQL server, a headless browser), installed with apt the first
time they are missing, as the README's test command promises: a fresh machine needs nothing done by hand."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from regional.machine_lock import held


def ensure(packages: list[str], present: Callable[[], bool], what: str) -> None:
    """Install ``packages`` unless ``present()``; ``what`` names them in the error when that is impossible."""
    if present():
        return
    # apt holds dpkg's lock and fails, not waits, when another apt runs: parallel test workers take turns.
    with held(Path("/tmp/regional-apt.lock")):
        if not present():  # installed by another process while this one waited
            _install(packages, present, what)


def _install(packages: list[str], present: Callable[[], bool], what: str) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(f"the tests need {what}: install Debian's {' '.join(packages)} "
                           f"(apt-get install {' '.join(packages)}) or run the test command as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    if not present():
        raise RuntimeError(f"apt-get installed {' '.join(packages)} but {what} is still missing")
