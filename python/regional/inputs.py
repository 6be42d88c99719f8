"""Where a regional source's records come from: one append-only log per region.

An input answers two questions: on the driver, how many records each region
holds now (``available``, and ``split`` of a range into what a task needs);
in the task, the records of one range (``read``) as Arrow record batches with
columns ``region``, ``offset``, ``value``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from regional.config import parse_int, parse_optional_int
from regional.errors import RegionalConfigError
from regional.ids import validate_region_id

SCHEMA = pa.schema([("region", pa.string()), ("offset", pa.int64()), ("value", pa.string())])
SCHEMA_DDL = "region STRING, offset BIGINT, value STRING"
BATCH_ROWS = 10_000


class RegionInput(Protocol):
    def ends(self) -> dict[str, int] | None:
        """A bounded input's final size per region; None when it may grow for ever."""
        ...

    def available(self, epoch: int) -> dict[str, int]:
        """Records each region holds (its offsets are ``0 .. n-1``), as seen when planning ``epoch``."""
        ...

    def split(self, region: str, start: int, end: int) -> Any:
        """On the driver: what a task needs to read ``[start, end)`` of ``region`` (picklable)."""
        ...

    def read(self, region: str, start: int, end: int, split: Any,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """In the task: the records ``[start, end)`` of ``region``, in offset order."""
        ...


def make_input(options: Mapping[str, str]) -> RegionInput:
    kind = options.get("source")
    if kind == "files":
        return FilesInput(options)
    if kind == "generator":
        return GeneratorInput(options)
    raise RegionalConfigError(
        f"unknown source {kind!r}: add .option('source', 'files') or .option('source', 'generator') to readStream"
    )


def batch_of(region: str, start: int, values: pa.Array) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [pa.array([region] * n, pa.string()) if n else pa.array([], pa.string()),
         pa.array(range(start, start + n), pa.int64()), values],
        schema=SCHEMA,
    )


# -- files ---------------------------------------------------------------------


@dataclass(frozen=True)
class FileSpan:
    name: str
    first_offset: int  # offset of the file's first line
    lines: int


class FilesInput:
    """``path`` holds one sub-directory per region; each is an append-only log of text files.

    Files are read in lexicographic name order; a visible file never changes
    (writers create it under a name starting with ``.`` or ``_`` and rename it).
    A line is a record; its offset is its index in the region, from 0, across files.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        path = options.get("path")
        if not path:
            raise RegionalConfigError("source=files needs the input directory: add .option('path', '/data/in')")
        self.root = Path(os.path.abspath(path))
        self._line_counts: dict[tuple[str, str], int] = {}  # (region, file) -> lines; files never change

    def regions(self) -> list[str]:
        if not self.root.is_dir():
            raise RegionalConfigError(f"source=files: path {self.root} is not a directory")
        root_real = os.path.realpath(self.root)
        found = []
        for entry in os.scandir(self.root):
            if _hidden(entry.name) or not entry.is_dir():
                continue
            try:
                region = validate_region_id(entry.name)
            except RegionalConfigError as exc:
                raise RegionalConfigError(
                    f"source=files: region directory {entry.name!r} under {self.root} cannot be a region id "
                    f"({exc}); rename it, or hide it with a leading '.' or '_'"
                ) from None
            real = os.path.realpath(entry.path)
            if os.path.commonpath([root_real, real]) != root_real:
                raise RegionalConfigError(
                    f"source=files: region directory {entry.name!r} links to {real}, outside {self.root}; "
                    "region directories must live under the source path"
                )
            found.append(region)
        return sorted(found)

    def spans(self, region: str) -> list[FileSpan]:
        directory = self.root / region
        names = sorted(n for n in os.listdir(directory) if not _hidden(n) and (directory / n).is_file())
        spans, offset = [], 0
        for name in names:
            key = (region, name)
            if key not in self._line_counts:
                self._line_counts[key] = _count_lines((directory / name).read_bytes())
            lines = self._line_counts[key]
            spans.append(FileSpan(name, offset, lines))
            offset += lines
        return spans

    def ends(self) -> None:
        return None  # files may be appended at any time

    def available(self, epoch: int) -> dict[str, int]:
        result = {}
        for region in self.regions():
            spans = self.spans(region)
            result[region] = spans[-1].first_offset + spans[-1].lines if spans else 0
        return result

    def split(self, region: str, start: int, end: int) -> list[FileSpan]:
        return [s for s in self.spans(region) if s.first_offset < end and s.first_offset + s.lines > start]

    def read(self, region: str, start: int, end: int, split: Any,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        for span in split:
            lines = _lines((self.root / region / span.name).read_bytes())
            lo = max(start - span.first_offset, 0)
            hi = min(end - span.first_offset, span.lines)
            for chunk in range(lo, hi, batch_rows):
                chunk_end = min(chunk + batch_rows, hi)
                yield batch_of(region, span.first_offset + chunk, lines.slice(chunk, chunk_end - chunk))


def _hidden(name: str) -> bool:
    return name.startswith(".") or name.startswith("_")


def _count_lines(data: bytes) -> int:
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def _lines(data: bytes) -> pa.Array:
    """The file's lines as a string array; ``\\n`` or ``\\r\\n`` ends a line, as in Spark's text source."""
    if not data:
        return pa.array([], pa.string())
    text = data.decode("utf-8", errors="replace")
    if text.endswith("\n"):
        text = text[:-1]
    lines = pc.list_flatten(pc.split_pattern(pa.array([text], pa.string()), "\n"))
    return pc.replace_substring_regex(lines, r"\r$", "")


# -- generator -----------------------------------------------------------------


class GeneratorInput:
    """Deterministic rows for tests and benchmarks.

    Options: ``regions`` (how many, ids ``g000``, ``g001``, ...), ``rowsPerEpoch``
    (records that become available per region per epoch), ``totalRows`` (per
    region; makes the source bounded) and ``valueSize`` (pad values to this size).
    ``value`` is a function of region and offset.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        count = parse_int(options, "regions", minimum=1, default="4")
        width = max(3, len(str(count - 1)))
        self.regions = [f"g{i:0{width}d}" for i in range(count)]
        self.rows_per_epoch = parse_int(options, "rowsPerEpoch", minimum=1, default="100")
        self.total_rows = parse_optional_int(options, "totalRows", minimum=0)
        self.value_size = parse_int(options, "valueSize", minimum=0, default="0")

    def ends(self) -> dict[str, int] | None:
        return None if self.total_rows is None else dict.fromkeys(self.regions, self.total_rows)

    def available(self, epoch: int) -> dict[str, int]:
        n = (epoch + 1) * self.rows_per_epoch
        if self.total_rows is not None:
            n = min(n, self.total_rows)
        return dict.fromkeys(self.regions, n)

    def split(self, region: str, start: int, end: int) -> None:
        return None

    def read(self, region: str, start: int, end: int, split: Any,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        for chunk in range(start, end, batch_rows):
            chunk_end = min(chunk + batch_rows, end)
            values = [generated_value(region, o, self.value_size) for o in range(chunk, chunk_end)]
            yield batch_of(region, chunk, pa.array(values, pa.string()))


def generated_value(region: str, offset: int, size: int = 0) -> str:
    value = f"{region}:{offset}"
    return value.ljust(size, ".") if size > len(value) else value
