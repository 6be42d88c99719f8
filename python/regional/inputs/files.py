"""``source=files``: ``path`` holds one sub-directory per region, an append-only log of text files.

Files are read in file-name order; a visible file never changes (writers create it under a name
starting with ``.`` or ``_`` and rename it). A line is a record; its offset is its index in the
region, from 0, across files; an empty file holds none. Columns: ``region, offset, value``.

A file that changes size after the source counted its lines (still being written under its final name, or
appended to) fails the query, naming the file: its lines' offsets would no longer be the ones already
published. The check holds within one run of the query; a file changed while the query is stopped is not
noticed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from regional.errors import RegionalConfigError
from regional.ids import validate_region_id
from regional.inputs.base import BATCH_ROWS, RegionInput
from regional.location import local_path

SCHEMA = pa.schema([("region", pa.string()), ("offset", pa.int64()), ("value", pa.string())])
SCHEMA_DDL = "region STRING, offset BIGINT, value STRING"


def create(options: dict[str, str]) -> FilesInput:
    return FilesInput(options)


def batch_of(region: str, start: int, values: pa.Array) -> pa.RecordBatch:
    # Built by Arrow, not from Python lists: a list and a range per batch cost ~1 ms per 10,000 rows.
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [pa.repeat(pa.scalar(region, pa.string()), n), pa.array(np.arange(start, start + n, dtype=np.int64)),
         values],
        schema=SCHEMA,
    )


@dataclass(frozen=True)
class FileSpan:
    name: str
    first_offset: int  # offset of the file's first line
    lines: int


class FilesInput(RegionInput[list[FileSpan]]):
    schema = SCHEMA
    schema_ddl = SCHEMA_DDL

    def __init__(self, options: Mapping[str, str]) -> None:
        path = options.get("path")
        if not path:
            raise RegionalConfigError("source=files needs the input directory: add .option('path', '/data/in')")
        self.root = local_path("path", path)
        self._line_counts: dict[tuple[str, str], tuple[int, int]] = {}  # (region, file) -> (bytes, lines)

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
        with os.scandir(self.root / region) as entries:
            found = sorted((e.name, e.stat().st_size) for e in entries if not _hidden(e.name) and e.is_file())
        spans, offset = [], 0
        for name, size in found:
            key = (region, name)
            known = self._line_counts.get(key)
            if known is None:
                data = (self.root / region / name).read_bytes()
                known = self._line_counts[key] = (len(data), _count_lines(data))
            elif known[0] != size:
                raise RegionalConfigError(
                    f"source=files: file {name!r} of region {region!r} changed after its lines were counted "
                    f"({known[0]} bytes then, {size} now): a visible file must never change. Write each file "
                    "under a name starting with '.' or '_' and rename it when it is complete; then restart the "
                    "query (records of the changed file may have to be checked by hand)")
            spans.append(FileSpan(name, offset, known[1]))
            offset += known[1]
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
    # The regex costs a third of the function: only files with a carriage return need it.
    return pc.replace_substring_regex(lines, r"\r$", "") if "\r" in text else lines
