"""``source=files``: the source wherever its files live (the manifest, the offsets, the rules for files that go
missing, planning and reading ranges); ``files.local`` and ``regional.inputs.object_files`` list and read one
kind of storage each. The rules are in ``regional.inputs.files``' docstring."""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from regional import failpoints
from regional.errors import NEW_QUERY, RegionalConfigError, RegionalDataLossError, RegionalStoreError
from regional.inputs.base import BATCH_ROWS, RegionInput, StoredInput
from regional.inputs.files.lines import LineFormat
from regional.inputs.files.manifest import (
    RULES,
    SCHEMA,
    SCHEMA_DDL,
    FileSpan,
    RegionChange,
    RegionFiles,
    apply_change,
    batch_of,
    glob_regex,
    is_hidden_path,
    overlapping,
)
from regional.inputs.files.partitions import PartitionColumns, decide, from_spark
from regional.location import Location

if TYPE_CHECKING:
    from regional.store import Store
    from regional.store.source_log import SourceLog

log = logging.getLogger("regional")

SOURCE_LOG = "files"
# The only way on that reads every file again: a new query, into a new target (into the same target it would publish
# every record a second time).
NEW_START = f"or, to read every file again from the start, {NEW_QUERY}"


class FilesInput(RegionInput[list[FileSpan]], StoredInput):
    """What the files source is wherever its files live: the manifest, the offsets, the rules for files that
    go missing, planning and reading ranges. A subclass lists and reads one kind of storage (``LocalFiles``
    here, ``regional.inputs.object_files.ObjectFiles``); ``create`` picks it from ``path``."""

    schema = SCHEMA
    schema_ddl = SCHEMA_DDL

    def __init__(self, location: Location, line_format: LineFormat | None = None,
                 name_glob: str | None = None, partition_dirs: bool = False) -> None:
        self.location = location
        self.format = line_format or LineFormat()
        self.glob = glob_regex(name_glob) if name_glob else None  # pathGlobFilter
        self.partition_dirs = partition_dirs  # recursiveFileLookup: key=value directories read, values not columns
        self.typed_partitions = True  # partitionColumnTypeInference
        self._columns: PartitionColumns | None = None  # decided at .load() (``decide_schema``), or Spark's
        self._fitting: set[str] = set()  # directories whose files were found to fit the partition columns
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

    def accepts(self, name: str) -> bool:
        """Whether the file ``name`` (its path under its region) is input: no hidden component, and its own name
        matches ``pathGlobFilter`` (as Spark matches it: the file's name, not its directories)."""
        if is_hidden_path(name):
            return False
        return self.glob is None or self.glob.fullmatch(name.rsplit("/", 1)[-1]) is not None

    # -- partition columns -------------------------------------------------------------------------

    def decide_schema(self) -> str:
        """At ``.load()``: the partition columns from the files present now (none with recursiveFileLookup)."""
        self._fix(self._discover())
        return self.schema_ddl

    def use_schema(self, fields: list[tuple[str, str]]) -> None:
        """The columns Spark fixed for the query: region, offset, value, then the partition columns."""
        if [(n.lower(), t) for n, t in fields[:3]] != [("region", "string"), ("offset", "bigint"),
                                                         ("value", "string")]:
            raise RegionalConfigError(
                f"source=files: the given schema starts {', '.join(f'{n} {t}' for n, t in fields[:3])}: it must "
                "start region STRING, offset BIGINT, value STRING (regional's columns), then the partition "
                "columns, if any")
        columns = from_spark(fields[3:], self.typed_partitions)
        if columns and self.partition_dirs:
            raise RegionalConfigError(
                f"source=files: the given schema has partition columns ({columns.describe()}), and "
                "recursiveFileLookup=true reads files without them (as in Spark). Remove one or the other")
        self._fix(columns)

    def columns(self) -> PartitionColumns:
        """The query's partition columns (decided from the files present at the first call, if Spark has not
        fixed them)."""
        if self._columns is None:
            self._fix(self._discover())
        assert self._columns is not None
        return self._columns

    def _fix(self, columns: PartitionColumns) -> None:
        self._columns = columns
        self.schema = pa.schema([*SCHEMA, *columns.fields()]) if columns else SCHEMA
        self.schema_ddl = SCHEMA_DDL + columns.ddl()

    def _discover(self) -> PartitionColumns:
        if self.partition_dirs:  # recursiveFileLookup: no partition inference, as in Spark
            return PartitionColumns(typed=self.typed_partitions)
        try:
            names = list(self._file_names())
        except RegionalConfigError:
            # The path does not exist yet, or a region directory cannot be a region: the first plan's listing says
            # so, with regional's own error, as before partition columns; nothing is read until then, so a restart
            # takes the columns of the files present at it.
            return PartitionColumns(typed=self.typed_partitions)
        return decide(names, self.typed_partitions, str(self.location))

    def _check_columns(self, region: str, names: Iterable[str]) -> None:
        """Every listed file fits the partition columns (checked once per directory)."""
        if self.partition_dirs:
            return  # recursiveFileLookup: key=value directories are plain ones
        columns = self.columns()
        for name in names:
            folder = name.rpartition("/")[0]
            if folder in self._fitting:
                continue
            try:
                columns.check(region, name, str(self.location), started_empty=False)
            except RegionalConfigError:
                if columns or any(f.files or f.end for f in self.manifest().values()):
                    raise
                columns.check(region, name, str(self.location), started_empty=True)  # what to say: restart
            self._fitting.add(folder)

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
                f"from the wrong place or read again. Give .option('path', {recorded!r}) again, {NEW_START}")
        counted = None  # the line format of the newest record that names one
        partitioned: list[list[str]] = []  # the partition columns of the newest record that names them (none before)
        try:
            for record in (snapshot, *deltas):
                rules = int(record.get("rules", 0))
                if "format" in record:
                    counted = LineFormat.from_json(record["format"])
                if "partitions" in record:
                    partitioned = [[str(n), str(t)] for n, t in record["partitions"]]
                for region, data in record["regions"].items():
                    files = manifest.setdefault(str(region), RegionFiles())
                    if record is snapshot:
                        files.end, files.next_seq = int(data["end"]), int(data["next"])
                        for entry in data["files"]:
                            files.put(FileSpan.from_json(entry, rules))
                        continue
                    apply_change(files, RegionChange(int(data["end"]), int(data["next"]),
                                                     [FileSpan.from_json(e, rules) for e in data["put"]],
                                                     [int(s) for s in data["drop"]]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RegionalStoreError(
                f"the regional store's manifest of files {self._log.directory} is unreadable "
                f"({type(exc).__name__}: {exc}): it was damaged. Restore it from a backup, {NEW_START}") from None
        if counted is not None and counted != self.format:
            raise RegionalConfigError(
                f"source=files: this query's checkpoint counted the lines of its files with {counted.describe()}, "
                f"and the options now say {self.format.describe()}: the offsets already given would name other "
                f"records (some lost, some read twice). Give the options as before ({counted.describe()}), "
                f"{NEW_START}")
        columns = self.columns()
        if partitioned != columns.to_json() and any(f.files or f.end for f in manifest.values()):
            old = PartitionColumns(tuple((n, t) for n, t in partitioned), self.typed_partitions)
            why = ""
            if not self.partition_dirs:  # name a file whose directories do not fit the old columns
                try:
                    for region, name in self._file_names():
                        old.check(region, name, str(self.location), started_empty=False)
                except RegionalConfigError as exc:
                    why = f" ({str(exc).split(': ', 1)[1].split(', but ')[0].split(' holds a value')[0]})"
            raise RegionalConfigError(
                f"source=files: this query's checkpoint read its files with {old.describe()}, and the query now "
                f"has {columns.describe()}{why} (from the partition directories under {self.location} when it "
                "was defined, or the options recursiveFileLookup and partitionColumnTypeInference): the records "
                "already published have the old columns. Give the options as before (and move out of path, or "
                "hide with a leading '.', a directory that does not fit the old columns), or give the old "
                "columns with "
                f".schema('{SCHEMA_DDL}{old.ddl()}') on "
                f"readStream (a later directory that does not fit them fails the query, naming it), {NEW_START}")
        return manifest

    def _save(self, changes: Mapping[str, RegionChange]) -> None:
        """Apply ``changes`` to the manifest, durably first (nothing in memory moves if the write fails)."""
        manifest = self.manifest()
        if self._log is not None:
            if self._log.seq < 0 or self._log.wants_snapshot():
                future = {r: RegionFiles(f.end, f.next_seq, dict(f.files), dict(f.names)) for r, f in manifest.items()}
                for region, change in changes.items():
                    apply_change(future.setdefault(region, RegionFiles()), change)
                self._log.write_snapshot({"source": SOURCE_LOG, "path": str(self.location), "rules": RULES,
                                          "format": self.format.to_json(), "partitions": self.columns().to_json(),
                                          "regions": {r: f.to_json() for r, f in future.items()}})
                self._manifest = future
                return
            if changes:
                self._log.append({"rules": RULES, "format": self.format.to_json(),
                                  "partitions": self.columns().to_json(),
                                  "regions": {r: c.to_json() for r, c in changes.items()}})
        for region, change in changes.items():
            apply_change(manifest.setdefault(region, RegionFiles()), change)

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
        for region, files in listing.items():
            self._check_columns(region, self._names(files))
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
    def _names(self, listing: Any) -> Iterable[str]:
        """The files of one region's listing (``_list``'s), by their paths under the region."""

    @abstractmethod
    def _file_names(self) -> Iterator[tuple[str, str]]:
        """On the driver, at ``.load()``: (region, path under the region) of every visible file, without reading
        any (the partition columns are decided from their directories)."""

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
                f"[{max(span.first_offset, done)}, {span.end}) not yet published (or it no longer matches "
                "pathGlobFilter, or took a hidden name): its records would be lost. Put it back (same name, same "
                f"content; give pathGlobFilter as before), {NEW_START}")
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
                f"[{done}, {known.end}) not yet published: its records would be lost. Put it back, {NEW_START}")
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
                f"files knows offsets up to {known.end}: the store was damaged or replaced. Restore it, {NEW_START}")
        committed = self._committed()
        spans, cursor = [], start
        for span in overlapping(known, start, end):
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
                f"it back, {NEW_START}")
        raise RegionalDataLossError(
            f"source=files: offsets [{lo}, {hi}) of region {region!r} under {self.location} are planned but not "
            f"published, and they are {where}: deleted or changed after their epoch was planned. Put the "
            f"file back (same name, same content), {NEW_START}")

    # -- reading, in the task ---------------------------------------------------------------------------

    def read(self, region: str, start: int, end: int, split: Any,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        columns = self.columns()
        for span in split:
            lo = max(start - span.first_offset, 0)
            hi = min(end - span.first_offset, span.lines)
            if hi <= lo:
                continue
            lines = self.format.for_rules(span.rules).decoded(span.name, self._read_span(region, span))
            if len(lines) != span.lines:  # the driver counted other records: never publish a shifted range
                raise RegionalDataLossError(
                    f"source=files: file {span.name!r} of region {region!r} holds {len(lines)} records when read, "
                    f"{span.lines} when counted: its offsets [{span.first_offset}, {span.end}) would name other "
                    "records. This is a bug of regional's line counting: report it with the file")
            values: list[pa.Scalar] = []
            if columns:  # the directories of the name the epoch was planned with (a file moved since: the same
                # values on every attempt; moved before the listing that planned it: its new ones)
                columns.check(region, span.name, str(self.location), started_empty=False)
                values = [pa.scalar(v, f.type) for v, f in zip(columns.values(span.name), columns.fields(),
                                                                  strict=True)]
            for chunk in range(lo, hi, batch_rows):
                chunk_end = min(chunk + batch_rows, hi)
                batch = batch_of(region, span.first_offset + chunk, lines.slice(chunk, chunk_end - chunk))
                if values:
                    batch = pa.RecordBatch.from_arrays(
                        [*batch.columns, *(pa.repeat(v, batch.num_rows) for v in values)], schema=self.schema)
                yield batch

