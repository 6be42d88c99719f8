"""The machine's processes as /proc shows them: one table, read once per sample, for the tools that watch
Spark's processes (the benchmarks' memory footprint, the standalone cluster's executors, the soak); and
stopping the test servers' process groups."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    name: str  # the kernel's short name (``comm``): "java", "python", ...
    cmdline: str  # the arguments joined by spaces


def process_table() -> dict[int, Process]:
    """Every process alive now (one that ends while it is read is left out)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        table[int(entry)] = Process(int(entry), int(fields[1]), stat[stat.index("(") + 1:stat.rindex(")")],
                                    argv.replace("\0", " ").strip())
    return table


def descendants(table: dict[int, Process], root: int) -> list[Process]:
    """The processes below ``root``, at any depth."""
    children: dict[int, list[Process]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


def rss_mb(pid: int | None) -> float:
    """Resident memory of a process in MB; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, TypeError):
        pass
    return 0.0


def open_files(pid: int | None) -> int:
    """Open file descriptors of a process; 0 when it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, TypeError):
        return 0


def log_tail(path: Path, chars: int = 3000) -> str:
    """The end of a server's log, for the error that says why it did not start (its directory may go with it)."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def kill_group(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a server started in a session of its own (``start_new_session``): its whole process group."""
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


def stop_group(process: subprocess.Popen[bytes] | None, grace_s: float) -> None:
    """SIGTERM such a server's process group, and SIGKILL it if it has not ended within ``grace_s``."""
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            kill_group(process)
