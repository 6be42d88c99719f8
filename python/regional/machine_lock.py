"""One process at a time on this machine for a first-use fetch (Delta Lake's jars, the tests' Maven jars and
Debian packages): two sessions or test workers started together on a fresh machine would otherwise both fetch
into the same cache, and the second could read the first's half-written files."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def held(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (created if missing) for the block; the kernel releases it
    when the process dies, so a killed fetch never leaves the lock held. Callers check again, inside the block,
    whether the thing is still missing: another process may have fetched it while this one waited."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
