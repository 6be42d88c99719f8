"""What the benchmark modules that write their own section of BENCHMARKS.md share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Run:
    """One timed run of one pipeline."""

    pipeline: str
    seconds: float
    rows: int

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def write_section(path: Path, name: str, section: str) -> None:
    """Put ``section`` (which starts and ends with ``markers(name)``) into BENCHMARKS.md in place of the
    previous one, or at the end; the rest of the file stays."""
    begin, end = markers(name)
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
    print(section)
