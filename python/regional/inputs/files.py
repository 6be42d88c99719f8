"""``source=files``: ``path`` holds one sub-directory per region, an append-only log of text files.

A line is a record; an empty file holds none. Columns: ``region, offset, value``. Writers create a file
under a name starting with ``.`` or ``_`` and rename it when it is complete; a visible file never changes.

Offsets: files in arrival order
-------------------------------
A region's offsets count its lines, from 0, across its files **in the order the driver first saw them**
(files first seen in the same listing: by name, a deterministic tie-break). Each region keeps a manifest:
every file it has seen, with its first offset, line count, size, inode, modification time and SHA-256. A
new file always gets the offsets after every known file, whatever its name, so an offset, once given, means
the same line for ever: ``part-10`` arriving after ``part-9`` comes after it, not before ``part-2``, and a
processed file deleted shifts nothing. This is what Spark's own file source does (a log of files in the
order it found them); a position "(file, line)" would have needed a new offset type in the protocol, whose
offsets are integers per region, and names would still have had to sort by arrival to say which file is
next.

The manifest is durable: it lives in the query's regional store (``sources/files/``: a snapshot and the
changes since, ``store.source_log``), written before ``available`` returns, so before Spark logs any plan
that uses its offsets. A driver killed between the two leaves offsets no plan used; the next listing finds
the same files known, with the same offsets. Each epoch writes only what changed (new, renamed, touched or
dropped files); the log is compacted into a new snapshot when the changes outweigh it. The manifest holds
one entry (about 150 bytes) per visible file: deleting processed files keeps it small.

Tasks never read the store: the split the driver makes for a range carries each file's name, first offset,
line count and identity. A task checks the file is still that file before reading it.

What writers may do, and what fails
-----------------------------------
- New files, with any names, in any order: read after everything known.
- A processed file deleted (or renamed to a hidden name): harmless. It is dropped from the manifest once
  a second listing still misses it.
- A file renamed (``mv`` within the file system) to another visible name: recognised by its inode, size
  and content (SHA-256), and never read again; a task whose planned file was renamed reads it under its new
  name. A file *copied* in is a new file, even when its content equals a processed file's: moving a file
  in from another file system is a copy.
- A visible file that changes (size, or content at the same size, e.g. written under its final name,
  appended to, or replaced by another file of that name) fails the query naming it, across restarts too
  (the manifest remembers each file's size and content). A file only touched, or replaced by a byte-equal
  copy, is the same file. A processed file renamed *and* appended to fails the same way (its inode and its
  old content are recognised at the start of the new name).
- A file deleted before all its lines were published fails the query, naming the file and the offsets it
  still had; a task whose planned file is gone fails naming it. Nothing is skipped silently. Put the file
  back (same name and content) to go on.
- A region directory removed fails the query at the next listing, naming the region and the offsets it had
  not published; one whose records were all published may go (it keeps its offsets, should it come back).
- ``path`` changed between restarts is refused, naming both: offsets of the old directory's files mean
  nothing in the new one.

A region is its directory's name: a region directory renamed is refused (a new region holding files of one
whose directory went away), since the new name would read them again from its start.

Limits: a file changed in place at the same size with its inode and modification time kept (``touch -r``)
is not noticed; a new file byte-equal to a deleted one, that the file system gives the deleted one's inode
before the deleted one is dropped, counts as that file renamed.

A checkpoint written before the manifest existed (offsets by file name) starts its manifest from the files
present, in name order: the offsets its epochs used, as long as no file arrived out of name order.
"""

from __future__ import annotations

import hashlib
import logging
import os
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from regional import failpoints
from regional.errors import RegionalConfigError, RegionalDataLossError, RegionalStoreError
from regional.ids import validate_region_id
from regional.inputs.base import BATCH_ROWS, RegionInput, StoredInput
from regional.location import Location, parse_location

if TYPE_CHECKING:
    from regional.store import Store
    from regional.store.source_log import SourceLog

log = logging.getLogger("regional")

SCHEMA = pa.schema([("region", pa.string()), ("offset", pa.int64()), ("value", pa.string())])
SCHEMA_DDL = "region STRING, offset BIGINT, value STRING"
SOURCE_LOG = "files"
READ_CHUNK = 8 << 20
NEWLINE = ord("\n")
COUNT_SLICE = 1 << 20
# Driver threads that fingerprint a listing's new files (SHA-256 and lines; both release the GIL), each holding
# one READ_CHUNK: CPU work, so no more than the cores; and only when the new files hold this much.
FINGERPRINT_THREADS = min(4, os.cpu_count() or 1)
PARALLEL_FINGERPRINT_BYTES = 4 << 20
DIGEST_CHARS = 32  # 128 bits of SHA-256: identity, not security


def create(options: dict[str, str]) -> FilesInput:
    path = options.get("path")
    if not path:
        raise RegionalConfigError("source=files needs the input directory: add .option('path', '/data/in') (or "
                                  "an s3a:// location)")
    location = parse_location("path", path)
    if location.is_local:
        return LocalFiles(location)
    from regional.inputs.object_files import ObjectFiles  # imports obstore: only where it is used

    return ObjectFiles(location)


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
    """One file of a region as the manifest knows it; a task's split is a list of these."""

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

    @property
    def end(self) -> int:
        return self.first_offset + self.lines

    def to_json(self) -> list[Any]:
        entry = [self.seq, self.name, self.first_offset, self.lines, self.size, self.inode, self.mtime_ns,
                 self.digest, self.gone]
        return [*entry, self.etag] if self.etag else entry

    @classmethod
    def from_json(cls, data: list[Any]) -> FileSpan:
        seq, name, first, lines, size, inode, mtime_ns, digest, gone = data[:9]
        etag = str(data[9]) if len(data) > 9 else ""  # written by an object store's listing only
        return cls(str(name), int(first), int(lines), int(size), int(inode), int(mtime_ns), str(digest), int(seq),
                   bool(gone), etag)


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
    size: int
    lines: int
    inode: int
    mtime_ns: int
    digest: str


class FilesInput(RegionInput[list[FileSpan]], StoredInput):
    """What the files source is wherever its files live: the manifest, the offsets, the rules for files that
    go missing, planning and reading ranges. A subclass lists and reads one kind of storage (``LocalFiles``
    here, ``regional.inputs.object_files.ObjectFiles``); ``create`` picks it from ``path``."""

    schema = SCHEMA
    schema_ddl = SCHEMA_DDL

    def __init__(self, location: Location) -> None:
        self.location = location
        self._store: Store | None = None
        self._log: SourceLog | None = None
        self._manifest: dict[str, RegionFiles] | None = None  # loaded on the driver's first call
        self._warned: set[tuple[str, str]] = set()
        self._present: set[str] = set()  # the regions of the last listing

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_store=None, _log=None, _manifest=None)  # tasks read files, never the store
        return state

    def use_store(self, store: Store) -> None:
        self._store, self._log, self._manifest = store, store.source_log(SOURCE_LOG), None

    # -- the manifest ------------------------------------------------------------------------------

    def manifest(self) -> dict[str, RegionFiles]:
        """Every region's files as known so far (loaded from the store at the first call)."""
        if self._manifest is None:
            self._manifest = self._load()
        return self._manifest

    def _load(self) -> dict[str, RegionFiles]:
        manifest: dict[str, RegionFiles] = {}
        loaded = self._log.load() if self._log is not None else None
        if loaded is None:
            if self._store is not None and self._store.epochs():
                log.warning("regional: source=files: the checkpoint %s has epochs but no manifest of files (it "
                            "was written by a regional that numbered lines by file name): the manifest starts "
                            "from the files of %s now, in name order", self._store.checkpoint, self.location)
            return manifest
        snapshot, deltas = loaded
        assert self._log is not None
        recorded = str(snapshot.get("path") if isinstance(snapshot, dict) else None)
        if recorded != str(self.location):
            raise RegionalConfigError(
                f"source=files: path is now {self.location}, but this query's checkpoint read path {recorded}: an "
                f"offset names a line of a file of {recorded}, and the files of {self.location} would be read "
                f"from the wrong place or read again. Give .option('path', {recorded!r}) again, or start "
                "the query on a new checkpointLocation (its input is then read from the start)")
        try:
            for region, data in snapshot["regions"].items():
                files = RegionFiles(int(data["end"]), int(data["next"]))
                for entry in data["files"]:
                    files.put(FileSpan.from_json(entry))
                manifest[str(region)] = files
            for delta in deltas:
                for region, data in delta["regions"].items():
                    files = manifest.setdefault(str(region), RegionFiles())
                    _apply(files, RegionChange(int(data["end"]), int(data["next"]),
                                               [FileSpan.from_json(e) for e in data["put"]],
                                               [int(s) for s in data["drop"]]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RegionalStoreError(
                f"the regional store's manifest of files {self._log.directory} is unreadable "
                f"({type(exc).__name__}: {exc}): it was damaged. Restore it from a backup, or start the query "
                "on a new checkpointLocation") from None
        return manifest

    def _save(self, changes: Mapping[str, RegionChange]) -> None:
        """Apply ``changes`` to the manifest, durably first (nothing in memory moves if the write fails)."""
        manifest = self.manifest()
        if self._log is not None:
            if self._log.seq < 0 or self._log.wants_snapshot():
                future = {r: RegionFiles(f.end, f.next_seq, dict(f.files), dict(f.names)) for r, f in manifest.items()}
                for region, change in changes.items():
                    _apply(future.setdefault(region, RegionFiles()), change)
                self._log.write_snapshot({"source": SOURCE_LOG, "path": str(self.location),
                                          "regions": {r: f.to_json() for r, f in future.items()}})
                self._manifest = future
                return
            if changes:
                self._log.append({"regions": {r: c.to_json() for r, c in changes.items()}})
        for region, change in changes.items():
            _apply(manifest.setdefault(region, RegionFiles()), change)

    def _committed(self) -> Callable[[str], int]:
        """Each region's committed offset (the store's latest epoch record), read at most once per call."""
        cache: dict[str, int] | None = None

        def committed(region: str) -> int:
            nonlocal cache
            if cache is None:
                states = self._store.region_states() if self._store is not None else {}
                cache = {r: s.committed_offset for r, s in states.items()}
            return cache.get(region, 0)

        return committed

    # -- listing, on the driver ----------------------------------------------------------------------

    def ends(self) -> None:
        return None  # files may be appended at any time

    def available(self, epoch: int) -> dict[str, int]:
        """Each region's end after this listing; new files get their offsets here, durably, before returning."""
        manifest = self.manifest()
        committed = self._committed()
        listing = self._list()
        if listing is None:  # the storage changed while listed: nothing decided, the regions as last seen
            return {r: manifest[r].end for r in sorted(self._present)}
        self._present = set(listing)
        changes: dict[str, RegionChange] = {}
        for region, files in listing.items():
            change = self._scan(region, files, manifest.get(region) or RegionFiles(), committed)
            if change.put or change.drop or region not in manifest:
                changes[region] = change
        present = set(listing)
        removed = sorted(set(manifest) - present)
        if removed and present - set(manifest):
            self._check_not_renamed(removed, {r: changes[r] for r in present - set(manifest)})
        for region in removed:
            change = self._removed(region, manifest[region], committed)
            if change.put or change.drop:
                changes[region] = change
        self._save(changes)
        if changes:
            failpoints.reach("files_manifest_written", epoch)  # crash tests: before Spark logs the plan
        manifest = self.manifest()
        return {r: manifest[r].end for r in sorted(present)}

    # -- what each storage does ---------------------------------------------------------------------

    @abstractmethod
    def _list(self) -> Mapping[str, Any] | None:
        """On the driver: the regions present now, each with its visible files as ``_scan`` takes them; None
        when the storage changed while it was listed (nothing is decided from such a listing)."""

    @abstractmethod
    def _scan(self, region: str, listing: Any, known: RegionFiles, committed: Callable[[str], int]) -> RegionChange:
        """On the driver: what changed in ``region`` since ``known``, given its files as ``_list`` found them."""

    @abstractmethod
    def _identity(self, span: FileSpan) -> tuple[Any, ...] | None:
        """What makes a file the same file under another name (a region directory renamed); None: nothing."""

    @abstractmethod
    def _locate(self, region: str, span: FileSpan, published: bool) -> FileSpan | None:
        """``span`` under its current name (it may have been renamed); None when it is gone. ``published``: the
        records the plan needs from it are all published (a re-run of a recorded epoch: it may be gone)."""

    @abstractmethod
    def _region_exists(self, region: str) -> bool: ...

    @abstractmethod
    def _read_span(self, region: str, span: FileSpan) -> bytes:
        """In the task: the bytes of ``span``'s file, checked to be the file the driver counted."""

    def _missing_all(self, region: str, spans: list[FileSpan], change: RegionChange,
                     committed: Callable[[str], int]) -> None:
        for span in spans:
            self._missing(region, span, change, committed)

    def _missing(self, region: str, span: FileSpan, change: RegionChange, committed: Callable[[str], int]) -> None:
        """A known file not listed: marked gone at the first listing that misses it; at the next, dropped if its
        records are all published, else the query fails naming it."""
        if not span.gone:
            change.put.append(replace(span, gone=True))
            return
        done = committed(region)
        if span.lines and span.end > done:
            raise RegionalDataLossError(
                f"source=files: file {span.name!r} of region {region!r} under {self.location} was deleted with offsets "
                f"[{max(span.first_offset, done)}, {span.end}) not yet published: its records would be lost. Put "
                "it back (same name, same content), or start the query on a new checkpointLocation")
        change.drop.append(span.seq)

    def _check_not_renamed(self, removed: list[str], new: Mapping[str, RegionChange]) -> None:
        """A region is its directory's name: a region directory renamed would be read again from the start under
        the new name. Refused when a new region holds a file of a region whose directory went away."""
        manifest = self.manifest()
        old = {self._identity(s): (r, s.name) for r in removed for s in manifest[r].files.values() if not s.gone}
        old.pop(None, None)
        for region, change in sorted(new.items()):
            for span in change.put:
                identity = self._identity(span)
                if identity in old:
                    was, name = old[identity]
                    raise RegionalConfigError(
                        f"source=files: region directory {region!r} under {self.location} holds {span.name!r}, "
                        f"the file {name!r} of region {was!r}, whose directory is gone: was {was!r} renamed to "
                        f"{region!r}? A region is its directory's name, and a new region is read from its start, "
                        f"so its records would be read twice. Rename the directory back to {was!r}; to read the "
                        "files again on purpose, copy them into a new directory before removing the old one (a "
                        f"copy is new input). If {region!r} is new input that only holds the same bytes, let "
                        f"{was!r} be seen gone first: put back an empty {was!r} (a directory, or on object storage "
                        f"an object '{was}/_keep') for one epoch, then remove it")

    def _removed(self, region: str, known: RegionFiles, committed: Callable[[str], int]) -> RegionChange:
        """A region directory that is no longer there. With records unpublished, the query fails naming the
        region; otherwise its files go missing like deleted ones, and the region keeps its offsets."""
        done = committed(region)
        if known.end > done:
            raise RegionalDataLossError(
                f"source=files: region directory {region!r} under {self.location} was removed with offsets "
                f"[{done}, {known.end}) not yet published: its records would be lost. Put it back, or start the "
                "query on a new checkpointLocation")
        change = RegionChange(known.end, known.next_seq)
        for span in known.files.values():
            self._missing(region, span, change, committed)
        return change

    # -- planning a range, on the driver ---------------------------------------------------------------

    def split(self, region: str, start: int, end: int) -> list[FileSpan]:
        """The files a task reads for ``[start, end)``, under their current names. A file the range needs that
        is gone fails here, on the driver, naming it; records below the committed offset (a re-run of an
        epoch already recorded) are not needed."""
        known = self.manifest().get(region) or RegionFiles()
        if end > known.end and (self._log is None or self._log.seq < 0):
            self.available(-1)  # a checkpoint from before the manifest re-runs its last plan: list first
            known = self.manifest().get(region) or RegionFiles()
        if end > known.end:
            raise RegionalStoreError(
                f"source=files: the plan reads offsets [{start}, {end}) of region {region!r} but the manifest of "
                f"files knows offsets up to {known.end}: the store was damaged or replaced. Restore it, or start "
                "the query on a new checkpointLocation")
        committed = self._committed()
        spans, cursor = [], start
        for span in _overlapping(known, start, end):
            if span.first_offset > cursor:
                self._check_published(region, cursor, span.first_offset, committed, "no longer in the manifest")
            cursor = max(cursor, span.end)
            found = self._locate(region, span, published=min(end, span.end) <= committed(region))
            if found is None:
                self._check_published(region, max(start, span.first_offset), min(end, span.end), committed,
                                      f"in file {span.name!r}, which is gone")
                continue
            spans.append(found)
        if cursor < end:
            self._check_published(region, cursor, end, committed, "no longer in the manifest")
        return spans

    def _check_published(self, region: str, lo: int, hi: int, committed: Callable[[str], int], where: str) -> None:
        if hi <= committed(region):
            return
        if not self._region_exists(region):
            raise RegionalDataLossError(
                f"source=files: region directory {region!r} under {self.location} was removed with offsets "
                f"[{max(lo, committed(region))}, {hi}) planned and not yet published: its records would be lost. Put "
                "it back, or start the query on a new checkpointLocation")
        raise RegionalDataLossError(
            f"source=files: offsets [{lo}, {hi}) of region {region!r} under {self.location} are planned but not "
            f"published, and they are {where}: deleted or changed after their epoch was planned. Put the "
            "file back (same name, same content), or start the query on a new checkpointLocation")

    # -- reading, in the task ---------------------------------------------------------------------------

    def read(self, region: str, start: int, end: int, split: Any,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        for span in split:
            lo = max(start - span.first_offset, 0)
            hi = min(end - span.first_offset, span.lines)
            if hi <= lo:
                continue
            lines = _lines(self._read_span(region, span))
            for chunk in range(lo, hi, batch_rows):
                chunk_end = min(chunk + batch_rows, hi)
                yield batch_of(region, span.first_offset + chunk, lines.slice(chunk, chunk_end - chunk))


class _ListingRaced(Exception):
    """``LocalFiles._scan_listing``: this listing may have crossed a rotation; list the region again. ``changed``:
    the error the listing found, raised if the second listing cannot be made."""

    def __init__(self, changed: RegionalConfigError) -> None:
        super().__init__(str(changed))
        self.changed = changed


@dataclass
class _LocalListing:
    """One region directory as a listing found it: its visible files, and the fingerprints read for it."""

    directory: Path
    files: dict[str, os.stat_result]
    fingerprints: dict[str, Fingerprint | None] = field(default_factory=dict)

    def fingerprint(self, name: str) -> Fingerprint | None:
        """The file's fingerprint as read for this listing (``LocalFiles._fingerprint_new``), or read now."""
        if name in self.fingerprints:
            return self.fingerprints.pop(name)  # read once per listing, as before: a second look reads again
        return _fingerprint_or_none(self.directory / name)


class LocalFiles(FilesInput):
    """The files source on a local (or mounted) file system: a file's identity is its inode, so a rename
    (``mv``) is recognised and a copy is new input."""

    def __init__(self, location: Location) -> None:
        super().__init__(location)
        self.root = location.local_path()

    def regions(self) -> list[str]:
        if not self.root.is_dir():
            raise RegionalConfigError(f"source=files: path {self.root} is not a directory")
        root_real = os.path.realpath(self.root)
        found = []
        for entry in os.scandir(self.root):
            if is_hidden(entry.name) or not entry.is_dir():
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

    def _list(self) -> dict[str, _LocalListing]:
        listing = {}
        for region in self.regions():
            try:
                listing[region] = _LocalListing(self.root / region, _visible_files(self.root / region))
            except (FileNotFoundError, NotADirectoryError):
                continue  # the directory vanished since the listing of regions
        self._fingerprint_new(listing)
        return listing

    def _fingerprint_new(self, listing: dict[str, _LocalListing]) -> None:
        """Read, in parallel, the listed files that ``_scan`` will fingerprint: new to the manifest, or not as it
        saw them (another inode, or the same size with another modification time). Reading them is most of a
        listing's work (their SHA-256 and lines), done before the epoch is planned, while the executors wait.
        Left to ``_scan``: another name of a known file (a hard link or a rename, whose bytes it may not need), a
        known file that grew (it fails without being read), and a read that failed here (``_scan`` reads again and
        fails in its own order, naming what it names)."""
        manifest = self.manifest()
        wanted: list[tuple[_LocalListing, str, int]] = []
        for region, found in listing.items():
            known = manifest.get(region) or RegionFiles()
            identities = {(span.inode, span.size) for span in known.files.values()}
            for name, st in found.files.items():
                seq = known.names.get(name)
                if seq is None:
                    if (st.st_ino, st.st_size) not in identities:
                        wanted.append((found, name, st.st_size))
                    continue
                span = known.files[seq]
                if st.st_ino != span.inode or (st.st_size == span.size and st.st_mtime_ns != span.mtime_ns):
                    wanted.append((found, name, st.st_size))
        if len(wanted) < 2 or sum(size for _f, _n, size in wanted) < PARALLEL_FINGERPRINT_BYTES:
            return  # little to read: ``_scan`` reads it, without threads to start
        # One task per thread, the files dealt out largest first: a task per file cost more than a small file.
        shares: list[list[tuple[_LocalListing, str, int]]] = [[] for _ in range(min(FINGERPRINT_THREADS,
                                                                                   len(wanted)))]
        loads = [0] * len(shares)  # bytes dealt to each share so far
        for item in sorted(wanted, key=lambda w: -w[2]):
            lightest = loads.index(min(loads))
            shares[lightest].append(item)
            loads[lightest] += item[2]
        try:
            with ThreadPoolExecutor(len(shares)) as pool:
                for future in [pool.submit(_fingerprint_share, share) for share in shares]:
                    future.result()
        except RuntimeError:  # no new threads (the interpreter is shutting down): ``_scan`` reads them itself
            return

    def _scan(self, region: str, listed: _LocalListing, known: RegionFiles,
              committed: Callable[[str], int]) -> RegionChange:
        try:
            return self._scan_listing(region, listed, known, committed, relisted=False)
        except _ListingRaced as raced:
            # A known name holds another inode and the known inode is nowhere in the listing: a file moved away and
            # a new one took its name (log rotation) while the directory was read, and the listing saw the new
            # file but not the moved one. Or the file was replaced: a second listing tells them apart.
            try:
                again = _LocalListing(listed.directory, _visible_files(listed.directory))
            except (FileNotFoundError, NotADirectoryError):  # the directory went meanwhile: what the first
                raise raced.changed from None  # listing found stands
            return self._scan_listing(region, again, known, committed, relisted=True)

    def _scan_listing(self, region: str, listed: _LocalListing, known: RegionFiles,
                      committed: Callable[[str], int], relisted: bool) -> RegionChange:
        directory, listing = listed.directory, listed.files
        change = RegionChange(known.end, known.next_seq)
        vanished = False  # a listed file that was gone when its content was looked at
        where: dict[tuple[int, int], str] = {}  # (inode, size) -> listed name; built when first needed
        inodes: set[tuple[int, int]] = set()  # (inode, size) of every known file; the same
        live: set[int] = set()  # known files still under their names
        reused: set[str] = set()  # known names that another file took (the known one was renamed away)
        for name, seq in known.names.items():
            st = listing.get(name)
            if st is None:
                continue
            span = known.files[seq]
            if (st.st_size, st.st_ino, st.st_mtime_ns) == (span.size, span.inode, span.mtime_ns):
                live.add(seq)
                continue
            if st.st_ino != span.inode and not where:
                where = {(s.st_ino, s.st_size): n for n, s in listing.items()}
                inodes = {(s.inode, s.size) for s in known.files.values()}
            if st.st_ino != span.inode and (where.get((span.inode, span.size), name) != name
                                            or (st.st_ino, st.st_size) in inodes):
                # Rotated: the known file went to another name, or another known file came to this one.
                reused.add(name)
                continue
            if st.st_size != span.size:
                changed = file_changed(region, span, f"{span.size} bytes when first seen, {st.st_size} now")
                raise _ListingRaced(changed) if st.st_ino != span.inode and not relisted else changed
            fp = listed.fingerprint(name)
            if fp is None:
                vanished = True
                continue  # gone while looked at: missing, or found under its new name below
            if fp.digest != span.digest:
                changed = file_changed(region, span, "same size, other content")
                raise _ListingRaced(changed) if fp.inode != span.inode and not relisted else changed
            live.add(seq)
            change.put.append(replace(span, inode=fp.inode, mtime_ns=fp.mtime_ns))  # touched, or a byte-equal copy
        new_names = sorted(n for n in listing if n not in known.names or n in reused)
        # A listing that crossed a rename can hold the old name and the new: the old one is looked at again. A
        # hard link (both names still there) is the same file: not read twice.
        by_inode = {(known.files[seq].inode, known.files[seq].size): seq for seq in live}
        for name in list(new_names):
            st = listing[name]
            linked = by_inode.get((st.st_ino, st.st_size))
            if linked is None or linked not in live:
                continue
            old = known.files[linked]
            try:
                still = os.stat(directory / old.name).st_ino == old.inode
            except FileNotFoundError:
                still = False
            if still:
                if (region, name) not in self._warned:
                    self._warned.add((region, name))
                    log.warning("regional: source=files: region %r: %r is a hard link of %r (offsets [%d, %d)): "
                                "the same file, not read again", region, name, old.name, old.first_offset, old.end)
                new_names.remove(name)
            else:
                live.discard(linked)
        missing = {seq: s for seq, s in known.files.items() if seq not in live}
        renamed: set[int] = set()
        for name in new_names:
            fp = listed.fingerprint(name)
            if fp is None:
                vanished = True
                continue  # gone while looked at: the next listing sees it, or not
            found = self._match_missing(region, name, fp, missing, renamed, committed, directory)
            if found is not None:
                renamed.add(found.seq)
                change.put.append(replace(found, name=name, inode=fp.inode, mtime_ns=fp.mtime_ns, gone=False))
                continue
            change.add_file(name, fp.lines, fp.size, fp.digest, fp.inode, fp.mtime_ns)
        if not vanished:
            self._missing_all(region, [s for seq, s in missing.items() if seq not in renamed], change, committed)
        # else a file went between the listing and the look at its content: a rename in flight, perhaps of a
        # missing file, whose new name this listing could not see. Nothing is marked missing or dropped from such a
        # listing (a processed file renamed twice across two listings was dropped, then read again as new).
        return change

    def _match_missing(self, region: str, name: str, fp: Fingerprint, missing: Mapping[int, FileSpan],
                       taken: set[int], committed: Callable[[str], int], directory: Path) -> FileSpan | None:
        """The known file that a new name is: the same inode and content (a rename), or the same name and content
        of a file that went missing with records unpublished (put back). None: a new file."""
        for span in missing.values():
            if span.seq in taken or span.size != fp.size or span.digest != fp.digest:
                continue
            if span.inode == fp.inode or (span.name == name and span.end > committed(region)):
                return span
        for span in missing.values():
            if span.seq not in taken and span.inode == fp.inode and 0 < span.size < fp.size \
                    and _prefix_digest(directory / name, span.size) == span.digest:
                raise file_changed(region, span, f"renamed to {name!r} and appended to ({span.size} bytes when first "
                                             f"seen, {fp.size} now)")
        return None

    def _identity(self, span: FileSpan) -> tuple[Any, ...] | None:
        return (span.inode, span.size)

    def _locate(self, region: str, span: FileSpan, published: bool) -> FileSpan | None:
        return _locate(self.root / region, span)

    def _region_exists(self, region: str) -> bool:
        return (self.root / region).is_dir()

    def _read_span(self, region: str, span: FileSpan) -> bytes:
        return _read_span(self.root / region, region, span)


def _apply(files: RegionFiles, change: RegionChange) -> None:
    for seq in change.drop:
        files.drop(seq)
    for span in change.put:
        files.put(span)
    files.end, files.next_seq = change.end, change.next_seq


def _overlapping(known: RegionFiles, start: int, end: int) -> list[FileSpan]:
    """Files holding offsets of ``[start, end)``, in offset order (newest first is where ranges usually are)."""
    found = []
    for span in reversed(known.files.values()):
        if span.end <= start and span.first_offset < start:
            break
        if span.first_offset < end and span.end > start:
            found.append(span)
    return found[::-1]


def _locate(directory: Path, span: FileSpan) -> FileSpan | None:
    """``span``'s file: under its name, or under the name it was renamed to since (same inode and size), or
    under its name with the same size but another inode (a copy, or another file: the reader compares content);
    None when it is gone."""
    try:
        st = os.stat(directory / span.name)
    except FileNotFoundError:
        st = None
    if st is not None and (st.st_ino, st.st_size) == (span.inode, span.size):
        return span
    try:
        for name, other in _visible_files(directory).items():
            if (other.st_ino, other.st_size) == (span.inode, span.size):
                return replace(span, name=name)
    except FileNotFoundError:
        pass
    return span if st is not None and st.st_size == span.size else None


def _visible_files(directory: Path) -> dict[str, os.stat_result]:
    """The visible files of ``directory`` and their stats; a file renamed or deleted while listed is left out."""
    found = {}
    with os.scandir(directory) as entries:
        for e in entries:
            if is_hidden(e.name) or not e.is_file():
                continue
            try:
                found[e.name] = e.stat()
            except FileNotFoundError:
                continue
    return found


def _read_span(directory: Path, region: str, span: FileSpan) -> bytes:
    """The bytes of ``span``'s file, checked to be the file the driver counted (size, and content unless inode
    and modification time are unchanged)."""
    located = _locate(directory, span)
    try:
        if located is None:
            raise FileNotFoundError(span.name)
        with open(directory / located.name, "rb") as f:
            data = f.read()
            st = os.fstat(f.fileno())
    except FileNotFoundError:
        raise RegionalDataLossError(
            f"source=files: file {span.name!r} of region {region!r} (offsets [{span.first_offset}, {span.end})) is "
            f"gone from {directory}: it was deleted or changed after its epoch was planned") from None
    if len(data) != span.size:
        raise file_changed(region, span, f"{span.size} bytes when first seen, {len(data)} when a task read it")
    if (st.st_ino, st.st_mtime_ns) != (span.inode, span.mtime_ns) \
            and short_digest(hashlib.sha256(data)) != span.digest:
        raise file_changed(region, span, "same size, other content when a task read it")
    return data


def file_changed(region: str, span: FileSpan, how: str) -> RegionalConfigError:
    return RegionalConfigError(
        f"source=files: file {span.name!r} of region {region!r} changed after its lines were counted ({how}): a "
        f"visible file must never change (its offsets [{span.first_offset}, {span.end}) would no longer be the "
        "lines already read). Write each file under a name starting with '.' or '_' and rename it when it is "
        "complete. Put the file back as it was and restart the query; if it is a new file that took the name of "
        "one deleted a moment ago, give it a name not used before (records of a changed file may have to be "
        "checked by hand)")


def _fingerprint_or_none(path: Path) -> Fingerprint | None:
    """Size, lines, identity and SHA-256 of a file, read once in chunks; None if it is gone."""
    try:
        with open(path, "rb") as f:
            size, lines, digest = size_lines_digest(iter(lambda: f.read(READ_CHUNK), b""))
            st = os.fstat(f.fileno())
    except FileNotFoundError:
        return None
    if st.st_size != size:
        raise RegionalConfigError(
            f"source=files: file {path} changed while its lines were counted ({size} bytes read, {st.st_size} "
            "now): a visible file must never change. Write each file under a name starting with '.' or '_' and "
            "rename it when it is complete")
    return Fingerprint(size, lines, st.st_ino, st.st_mtime_ns, digest)


def size_lines_digest(chunks: Iterable[bytes]) -> tuple[int, int, str]:
    """A file's size, lines (a last line without a newline counts) and short SHA-256, from its bytes in chunks,
    read once: on local disk and on object storage alike."""
    h = hashlib.sha256()
    size = lines = 0
    last = b"\n"
    for chunk in chunks:
        h.update(chunk)
        lines += newlines(chunk)
        size += len(chunk)
        last = chunk[-1:] or last
    return size, lines + (last != b"\n"), short_digest(h)


def _fingerprint_share(share: list[tuple[_LocalListing, str, int]]) -> None:
    """One thread's files of ``LocalFiles._fingerprint_new``; a file it cannot read is left for ``_scan``."""
    for found, name, _size in share:
        try:
            found.fingerprints[name] = _fingerprint_or_none(found.directory / name)
        except Exception:  # _scan reads it again, and raises what a listing raised before, in its order
            continue


def newlines(chunk: bytes) -> int:
    """``chunk.count(b"\\n")``, as fast, without holding the GIL (numpy's comparison releases it), so that the
    threads fingerprinting files count lines at once while hashing. By slices: the comparison's mask stays small."""
    if len(chunk) < COUNT_SLICE and isinstance(chunk, bytes):
        return chunk.count(b"\n")  # a small file: numpy's call costs more than the count
    data = np.frombuffer(chunk, np.uint8)
    return sum(int(np.count_nonzero(data[i:i + COUNT_SLICE] == NEWLINE)) for i in range(0, len(data), COUNT_SLICE))


def _prefix_digest(path: Path, size: int) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            left = size
            while left and (chunk := f.read(min(READ_CHUNK, left))):
                h.update(chunk)
                left -= len(chunk)
    except FileNotFoundError:
        return None
    return short_digest(h)


def short_digest(h: Any) -> str:
    return str(h.hexdigest()[:DIGEST_CHARS])


def is_hidden(name: str) -> bool:
    return name.startswith(".") or name.startswith("_")


def _count_lines(data: bytes) -> int:
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def _lines(data: bytes) -> pa.Array:
    """The file's lines as a string array; ``\\n`` or ``\\r\\n`` ends a line, as in Spark's text source. Bytes that
    are not UTF-8 become U+FFFD, as Python's ``errors="replace"`` makes them."""
    if not data:
        return pa.array([], pa.string())
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    text = _utf8_as_arrow(data, end)
    if text is None:  # not UTF-8: Python's decoder replaces what it cannot read. (2 GiB and more: no Arrow string
        # array holds it, and this raises ArrowCapacityError, as before; the region falls back and is retried.)
        text = pa.array([data[:end].decode("utf-8", errors="replace")], pa.string())
    lines = pc.list_flatten(pc.split_pattern(text, "\n"))
    # The regex costs a third of the function: only files with a carriage return need it.
    return pc.replace_substring_regex(lines, r"\r$", "") if b"\r" in data else lines


def _utf8_as_arrow(data: bytes, end: int) -> pa.Array | None:
    """``data[:end]`` as a one-string Arrow array over the same memory; None unless it is valid UTF-8 and fits one
    string (under 2 GiB). Decoding a file into a Python string and copying that into Arrow took a task longer than
    splitting it into lines. Arrow's check refuses what Python's strict UTF-8 decoder refuses (surrogates,
    overlong forms)."""
    if end >= 2**31:
        return None
    offsets = pa.py_buffer(np.array([0, end], np.int32).tobytes())
    text = pa.StringArray.from_buffers(1, offsets, pa.py_buffer(data))
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return text
