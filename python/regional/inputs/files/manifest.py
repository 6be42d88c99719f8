"""``source=files``: what the driver knows of each region's files (the manifest), shared by every kind of storage.

Pure data: no I/O. ``regional.inputs.files.source`` keeps it durable; the listings of a local disk
(``files.local``) and of an object store (``regional.inputs.object_files``) fill it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from regional.errors import RegionalConfigError

SCHEMA = pa.schema([("region", pa.string()), ("offset", pa.int64()), ("value", pa.string())])
SCHEMA_DDL = "region STRING, offset BIGINT, value STRING"
DIGEST_CHARS = 32  # 128 bits of SHA-256: identity, not security
# How a file's records were counted: 0, before issue 46 (``\n`` and ``\r\n`` only, no byte-order mark dropped, no
# codec); 1, as Spark's text source (``lines.LineFormat``) but for codecs' extensions in upper case (read as they
# are) and a lineSep that can overlap itself at a file's end; 2, as Spark's text source in these too (issue 59).
# A file keeps the rules it was counted with for ever, or its offsets would name other records. Manifest records
# written with rules 1 or later say so ("rules": 1); a file in one written before says nothing, and is a file of
# rules 0.
RULES = 2


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
    """One file of a region as the manifest knows it; a task's split is a list of these. ``name`` is the file's
    path under its region's directory, ``/``-separated (``date=2026-11-26/part-0.txt``)."""

    name: str
    first_offset: int  # offset of the file's first line
    lines: int
    size: int = 0
    inode: int = 0
    mtime_ns: int = 0
    digest: str = ""  # SHA-256 of the content (hex, first DIGEST_CHARS)
    seq: int = 0  # arrival number in the region: the manifest's key
    gone: bool = False  # missing from the last listing (dropped, or a failure, if still missing at the next)
    etag: str = ""  # on an object store, the object's ETag when last looked at (inode and mtime_ns are 0 there)
    rules: int = RULES  # how its records were counted (``RULES``)

    @property
    def end(self) -> int:
        return self.first_offset + self.lines

    def to_json(self) -> list[Any]:
        entry = [self.seq, self.name, self.first_offset, self.lines, self.size, self.inode, self.mtime_ns,
                 self.digest, self.gone]
        if self.rules != RULES:
            return [*entry, self.etag, self.rules]
        return [*entry, self.etag] if self.etag else entry

    @classmethod
    def from_json(cls, data: list[Any], rules: int) -> FileSpan:
        """``rules``: the record's (a span that says none was counted with them)."""
        seq, name, first, lines, size, inode, mtime_ns, digest, gone = data[:9]
        etag = str(data[9]) if len(data) > 9 else ""  # written by an object store's listing only
        return cls(str(name), int(first), int(lines), int(size), int(inode), int(mtime_ns), str(digest), int(seq),
                   bool(gone), etag, int(data[10]) if len(data) > 10 else rules)


@dataclass
class RegionFiles:
    """A region's manifest: its files by arrival number (so in offset order), and where its next file starts."""

    end: int = 0  # the next offset a new file gets
    next_seq: int = 0
    files: dict[int, FileSpan] = field(default_factory=dict)
    names: dict[str, int] = field(default_factory=dict)  # visible name -> seq, for files not gone

    def put(self, span: FileSpan) -> None:
        old = self.files.get(span.seq)
        if old is not None and not old.gone and self.names.get(old.name) == span.seq:
            del self.names[old.name]
        self.files[span.seq] = span
        if not span.gone:
            self.names[span.name] = span.seq

    def drop(self, seq: int) -> None:
        old = self.files.pop(seq, None)
        if old is not None and not old.gone and self.names.get(old.name) == seq:
            del self.names[old.name]

    def to_json(self) -> dict[str, Any]:
        return {"end": self.end, "next": self.next_seq, "files": [s.to_json() for s in self.files.values()]}


@dataclass
class RegionChange:
    end: int
    next_seq: int
    put: list[FileSpan] = field(default_factory=list)
    drop: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"end": self.end, "next": self.next_seq, "put": [s.to_json() for s in self.put], "drop": self.drop}

    def add_file(self, name: str, lines: int, size: int, digest: str, inode: int = 0, mtime_ns: int = 0,
                 etag: str = "") -> None:
        """A new file: the offsets after every known one."""
        self.put.append(FileSpan(name, self.end, lines, size, inode, mtime_ns, digest, self.next_seq, etag=etag))
        self.end += lines
        self.next_seq += 1


@dataclass(frozen=True)
class Fingerprint:
    """A file as read once by the driver. ``content``: for a compressed file, the size and SHA-256 of what it
    decompresses to (a compressed copy of a known file is that file: logrotate's ``compress``); else None."""

    size: int
    lines: int
    inode: int
    mtime_ns: int
    digest: str
    content: tuple[int, str] | None = None


def apply_change(files: RegionFiles, change: RegionChange) -> None:
    for seq in change.drop:
        files.drop(seq)
    for span in change.put:
        files.put(span)
    files.end, files.next_seq = change.end, change.next_seq


def overlapping(known: RegionFiles, start: int, end: int) -> list[FileSpan]:
    """Files holding offsets of ``[start, end)``, in offset order (newest first is where ranges usually are)."""
    found = []
    for span in reversed(known.files.values()):
        if span.end <= start and span.first_offset < start:
            break
        if span.first_offset < end and span.end > start:
            found.append(span)
    return found[::-1]


def short_digest(h: Any) -> str:
    return str(h.hexdigest()[:DIGEST_CHARS])


def is_hidden(name: str) -> bool:
    """A file or directory name that Spark's file listing leaves out (``InMemoryFileIndex``): starting with ``.``,
    or with ``_`` unless it holds ``=`` (``_col=1`` is a partition directory), or ending with ``._COPYING_`` (a
    copy under way, as ``hdfs dfs -put`` writes it)."""
    return (name.startswith(".") or (name.startswith("_") and "=" not in name)
            or name.endswith("._COPYING_"))


def is_hidden_path(name: str) -> bool:
    """``name`` (a path under a region, ``/``-separated) is hidden when any of its components is."""
    return any(is_hidden(part) for part in name.split("/"))


def file_changed(region: str, span: FileSpan, how: str) -> RegionalConfigError:
    return RegionalConfigError(
        f"source=files: file {span.name!r} of region {region!r} changed after its lines were counted ({how}): a "
        f"visible file must never change (its offsets [{span.first_offset}, {span.end}) would no longer be the "
        "lines already read). Write each file under a name starting with '.' or '_' and rename it when it is "
        "complete. Put the file back as it was and restart the query; if it is a new file that took the name of "
        "one deleted a moment ago, give it a name not used before (records of a changed file may have to be "
        "checked by hand)")


def rotation_of(original: str, copy: str) -> bool:
    """Whether ``copy`` (a compressed file's path) names a rotation of ``original``: the same directory and name,
    once the codec's extension and a rotation number (``.1``, ``.2``) are taken off both (``app.log.1`` and
    ``app.log.2.gz``; ``app.log-20261126`` and ``app.log-20261126.gz``; ``x.txt`` and ``x.txt.gz``). Only such a
    compressed copy of a known file is that file: other bytes alike are new input (a heartbeat)."""
    def stem(name: str) -> str:
        for ext in (".gz", ".bz2", ".zst", ".lz4", ".snappy", ".deflate"):  # in any case, as codecs are picked
            if name.lower().endswith(ext):
                name = name[:-len(ext)]
        return re.sub(r"\.\d+$", "", name)

    return stem(original) == stem(copy)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Hadoop's ``GlobPattern`` (Spark's ``pathGlobFilter``, matched against a file's name) as a regex: ``*``,
    ``?``, ``[abc]``, ``[^a]`` or ``[!a]``, ``{a,b}``, and ``\\`` escaping the next character."""
    out, i, depth = [], 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            close = pattern.find("]", i + 2 if pattern[i + 1:i + 2] in ("^", "!") else i + 1)
            if close < 0:
                raise RegionalConfigError(f"pathGlobFilter {pattern!r}: '[' at {i} is never closed")
            body = pattern[i + 1:close]
            if body[:1] in ("^", "!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = close
        elif c == "{":
            depth += 1
            out.append("(?:")
        elif c == "}" and depth:
            depth -= 1
            out.append(")")
        elif c == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(c))
        i += 1
    if depth:
        raise RegionalConfigError(f"pathGlobFilter {pattern!r}: '{{' is never closed")
    try:
        return re.compile("".join(out), re.DOTALL)
    except re.error as exc:
        raise RegionalConfigError(f"pathGlobFilter {pattern!r} is not a glob Spark takes ({exc})") from None
