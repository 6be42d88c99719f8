"""``source=files`` on an object store (``s3a://``, ``gs://``, ``abfss://``): the source, its offsets and its
rules as on a local disk (``regional.inputs.files``), with what an object store can and cannot tell.

Listing
-------
One LIST of everything under ``path`` per epoch, for all regions together (``Storage.list(recursive=True)``):
S3 answers 1,000 keys per request, so an epoch costs ceil(objects under ``path`` / 1,000) requests whatever
the number of regions. At 1,000 regions with a few files each that is a handful of requests per epoch, where a
listing per region would be 1,000 (at S3's $0.005 per 1,000 LISTs, $0.005 an epoch: $43 a day at one epoch every
10 s). Deleting processed files keeps the listing short. Each new object is then read once by the driver (in
parallel), to count its lines and take its SHA-256, as on a local disk, and once by the task that reads it.

- A region is the first component of a key under ``path``; a file of it is the rest of the key, at any depth
  (``us/date=2026-11-26/part-0.txt`` is ``date=2026-11-26/part-0.txt`` of region ``us``), as on disk. An object
  directly under ``path`` belongs to no region and fails the query. A component hidden as Spark's listing hides
  it (``.`` first, or ``_`` first without ``=``: ``_temporary/``, ``.staging``) hides the object.
- Records, codecs and compressed copies of known files (logrotate's ``compress``) as on disk
  (``regional.inputs.files``). A compressed copy is recognised by its decompressed bytes, here as on disk.
- A region whose objects were all deleted has no prefix any more: it is a removed region directory, which
  may go once all its records are published (it keeps its offsets, should it come back).

Identity
--------
An object has no inode, and an object store has no rename: ``aws s3 mv`` is a copy and a delete. A file is
the same file when it has the same size and content (SHA-256); its ETag only says when to look again. A new
name is new input, as in Spark's file source, with one exception:

- **A move seen whole, of a file with records unpublished, is the same file**: its name went missing in the
  very listing in which its bytes appeared under a new name (its deletion would otherwise fail the query, and
  its records be read twice). Under its own name, such a file deleted and put back is the same file.
- Anything else with the same bytes is new input: a copy; a move caught between its copy and its delete (the
  copy is read, and the original's records too if they were not yet); a published file moved; the same
  heartbeat line every minute with the processed files deleted (never lost). So do not move files within
  ``path``: move processed ones out of it, or delete them, and upload temporary files under hidden names.

And as on disk:

- Writers need no hidden name: an object appears whole when its PUT completes.
- An object written again under its name with other content fails the query naming it (an object store
  cannot append: a longer object is another object); written again byte-equal (even after a delete), it is
  the same file: a name is one file, new input needs a new name. A known name that takes another known
  file's bytes while that file goes missing is a rotation (``mv a a.1``, ``mv b a``); while that file is
  still there, it is held for ``COPY_GRACE_S`` (a move under way) before it fails as written again.
- A listing that raced with a change (an object gone between its LIST and its GET) is made again (up to
  ``LIST_ATTEMPTS``), and if it keeps racing, nothing is decided until the next epoch.
- A task whose planned file was moved since finds it under its new name, by size and content (objects with
  its ETag first), reading each object of its size in its region until one matches: costly only when a file
  with unpublished records moved after its epoch was planned. A re-run of a recorded epoch skips files whose
  records are all published (they may have been deleted).

Limits: a region prefix moved (``aws s3 mv --recursive``) while the query runs is read again under its new
name unless one listing sees it whole (then it is refused, as a renamed directory is): stop the query first.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from regional.errors import RegionalConfigError, RegionalDataLossError
from regional.ids import validate_region_id
from regional.inputs.files.lines import CorruptFile, LineFormat, codec_of
from regional.inputs.files.manifest import (
    RULES,
    FileSpan,
    RegionChange,
    RegionFiles,
    file_changed,
    is_hidden,
    rotation_of,
    short_digest,
)
from regional.inputs.files.source import FilesInput
from regional.location import Location
from regional.storage import ObjectInfo, Storage, open_storage

log = logging.getLogger("regional")

FETCH_THREADS = 16  # each new object is a GET: ask for many at once
# ``mv b a`` over a known ``a`` is a copy and a delete: ``a`` holding ``b``'s bytes while ``b`` is still there waits
# this long (and for a later listing) for the delete, before it fails as a file written again. Time, not a
# count of listings: Spark may list twice within milliseconds.
COPY_GRACE_S = 10.0
LIST_ATTEMPTS = 3  # listings that raced with a change (an object gone between LIST and GET) are made again


@dataclass(frozen=True)
class _Content:
    """An object as read once: what it holds."""

    size: int
    lines: int
    digest: str
    etag: str
    content: tuple[int, str] | None = None  # compressed: what it decompresses to (size, SHA-256)


@dataclass
class _RegionListing:
    objects: dict[str, ObjectInfo] = field(default_factory=dict)  # visible name -> info, from the LIST
    read: dict[str, _Content] = field(default_factory=dict)  # names read this epoch (new, or written again)
    vanished: bool = False  # an object listed was gone when read: the listing raced with a change


class ObjectFiles(FilesInput):
    """The files source on an object store (see the module)."""

    def __init__(self, location: Location, line_format: LineFormat | None = None,
                 name_glob: str | None = None, partition_dirs: bool = False) -> None:
        super().__init__(location, line_format, name_glob, partition_dirs)
        self._storage: Storage | None = None
        # (region, name) -> (ETag, when first held): names held back by the last listing, and by this one
        self._held_before: dict[tuple[str, str], tuple[str, float]] = {}
        self._held: dict[tuple[str, str], tuple[str, float]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_storage=None, _held_before={}, _held={})
        return state

    @property
    def storage(self) -> Storage:
        if self._storage is None:  # built where it is used: on the driver, or in the task
            self._storage = open_storage(self.location)
        return self._storage

    # -- the driver ----------------------------------------------------------------------------------

    def _list(self) -> dict[str, _RegionListing] | None:
        for _attempt in range(LIST_ATTEMPTS):
            listing = self._list_once()
            if not any(files.vanished for files in listing.values()):
                self._held_before, self._held = self._held, {}  # only what this listing holds again stays held
                return listing
        # Objects keep vanishing between the LIST and their GET: what moved where is not known (a file moved twice
        # looks deleted, a region moved looks new). Nothing is decided until a listing holds still.
        log.warning("regional: source=files: %s changed during each of %d listings; trying again next epoch",
                    self.location, LIST_ATTEMPTS)
        return None

    def _list_once(self) -> dict[str, _RegionListing]:
        listing: dict[str, _RegionListing] = {}
        for region, name, info in self._objects():
            files = listing.setdefault(region, _RegionListing())
            if name:
                files.objects[name] = replace(info, name=name)
        self._read_new(listing)
        return listing

    def _names(self, listing: _RegionListing) -> Iterable[str]:
        return listing.objects.keys()

    def _file_names(self) -> Iterator[tuple[str, str]]:
        return ((region, name) for region, name, _info in self._objects() if name)

    def _objects(self) -> Iterator[tuple[str, str, Any]]:
        """(region, path under the region, the object's info) of every object under ``path``; the path is "" for
        an object that is no input file (a region's marker, hidden, not matching pathGlobFilter)."""
        for info in self.storage.list("", recursive=True):
            region_name, slash, name = info.name.partition("/")
            if is_hidden(region_name):
                continue
            if not slash:  # Spark's text source would read it: never leave it unread in silence
                raise RegionalConfigError(
                    f"source=files: object {region_name!r} is directly under path {self.location}, where only "
                    "region prefixes belong (path/<region>/<files>): its records would be read by no region. Move "
                    f"it under a region (e.g. <region>/{region_name}), or give it a name starting with '.' or '_'")
            if "=" in region_name:
                raise RegionalConfigError(
                    f"source=files: {region_name!r} under {self.location} looks like a partition directory "
                    "(key=value), but the prefixes directly under path are regions (path/<region>/...): give the "
                    "path above the regions (partition directories belong inside a region), or rename it if it is "
                    "a region")
            try:
                region = validate_region_id(region_name)
            except RegionalConfigError as exc:
                raise RegionalConfigError(
                    f"source=files: region prefix {region_name!r} under {self.location} cannot be a region id "
                    f"({exc}); rename its objects, or hide them with a leading '.' or '_'") from None
            yield region, (name if name and not name.endswith("/") and self.accepts(name) else ""), info

    def _hold(self, region: str, name: str, etag: str, why: str) -> bool:
        """Whether to hold back ``name`` (its ETag ``etag``) in this listing: until a later listing at least
        ``COPY_GRACE_S`` after the first that held it (the same object: the same ETag)."""
        now = time.monotonic()
        before = self._held_before.get((region, name))
        if before is not None and before[0] == etag and now - before[1] >= COPY_GRACE_S:
            return False
        if before is None or before[0] != etag:
            before = (etag, now)
            log.info("regional: source=files: region %r: %r %s; held back for %.0f s in case it is being moved "
                     "(a copy, then a delete)", region, name, why, COPY_GRACE_S)
        self._held[(region, name)] = before
        return True

    def _read_new(self, listing: dict[str, _RegionListing]) -> None:
        """Read, in parallel, every listed object that is new or was written again since the manifest saw it."""
        manifest = self.manifest()
        wanted = []
        for region, files in listing.items():
            known = manifest.get(region) or RegionFiles()
            for name, info in files.objects.items():
                seq = known.names.get(name)
                span = known.files[seq] if seq is not None else None
                if span is None or (span.size, span.etag) != (info.size, info.etag):
                    wanted.append((region, name))
        if not wanted:
            return
        with ThreadPoolExecutor(min(FETCH_THREADS, len(wanted))) as pool:
            contents = list(pool.map(lambda rn: self._content(f"{rn[0]}/{rn[1]}"), wanted))
        for (region, name), content in zip(wanted, contents, strict=True):
            if content is None:
                listing[region].vanished = True
            else:
                listing[region].read[name] = content

    def _content(self, key: str) -> _Content | None:
        got = self.storage.read_stream(key)
        if got is None:
            return None
        info, chunks = got
        try:
            size, lines, digest, content = self.format.fingerprint(key, chunks)
        except CorruptFile as exc:
            raise RegionalConfigError(
                f"source=files: object {key!r} under {self.location} is {exc}, though its name ends as a "
                f"{codec_of(key)} file's: Spark's text source fails on it too, and its records cannot be read. Move "
                "it out of path (or give it a name starting with '.' or '_'), and upload it again, whole, under a "
                "new name") from None
        return _Content(size, lines, digest, info.etag, content)

    def _scan(self, region: str, listing: _RegionListing, known: RegionFiles,
              committed: Callable[[str], int]) -> RegionChange:
        change = RegionChange(known.end, known.next_seq)
        objects, read = listing.objects, listing.read
        live: set[int] = set()  # known files still under their names, with their content
        written_again: list[tuple[str, int]] = []
        for name, seq in known.names.items():
            info = objects.get(name)
            if info is None:
                continue
            span = known.files[seq]
            if (info.size, info.etag) == (span.size, span.etag):
                live.add(seq)
            elif name in read:
                written_again.append((name, seq))
        listed_by_content: dict[tuple[int, str], list[str]] = {}
        for n, c in read.items():
            listed_by_content.setdefault((c.size, c.digest), []).append(n)
        known_by_content: dict[tuple[int, str], list[int]] = {}
        for seq, span in known.files.items():
            known_by_content.setdefault((span.size, span.digest), []).append(seq)

        def at_its_name(seq: int) -> bool:
            span = known.files[seq]
            content = read.get(span.name)
            return seq in live or (content is not None and (content.size, content.digest) == (span.size, span.digest))

        def going_missing(seq: int) -> bool:  # seen at the last listing, not at its name in this one
            return not known.files[seq].gone and not at_its_name(seq)

        reused: list[str] = []  # known names that now hold another file (the known one moved away, or came here)
        for name, seq in written_again:
            span, content = known.files[seq], read[name]
            if (content.size, content.digest) == (span.size, span.digest):
                live.add(seq)  # written again byte-equal: the same file
                change.put.append(replace(span, etag=content.etag))
                continue
            came = [o for o in known_by_content.get((content.size, content.digest), []) if o != seq]
            moved_away = any(n != name for n in listed_by_content.get((span.size, span.digest), []))
            if moved_away or any(going_missing(o) for o in came):
                reused.append(name)  # a rotation: this file moved away, or another moved here
                continue
            if any(at_its_name(o) for o in came) and self._hold(region, name, content.etag,
                                                                 "was written again with another file's bytes"):
                live.add(seq)  # ``mv other name`` between its copy and its delete: decided at a later listing
                continue
            raise file_changed(region, span, f"{span.size} bytes when first seen, {content.size} now"
                               if content.size != span.size else "same size, other content (written again)")
        missing = {seq: s for seq, s in known.files.items() if seq not in live}
        done = committed(region)
        moved: set[int] = set()
        names = sorted([n for n in objects if n not in known.names] + reused)
        decided: set[str] = set()
        for name in names:  # moves first: a compressed copy is judged knowing where every original is now
            content = read[name]
            # A file with records unpublished whose name went missing in this very listing, and its bytes under a
            # new name: moved (its deletion would otherwise fail the query, and its records be read twice). Under
            # its own name: put back. Nothing else is matched: the same bytes again are new input, as in Spark's
            # file source (the same heartbeat line each minute, the processed ones deleted, is never lost).
            found = next((s for s in missing.values() if s.seq not in moved and s.end > done
                          and (not s.gone or s.name == name)
                          and (s.size, s.digest) == (content.size, content.digest)), None)
            if found is not None:
                moved.add(found.seq)  # the same file, never read again
                decided.add(name)
                change.put.append(replace(found, name=name, etag=content.etag, gone=False))
        copied: set[int] = set()
        for name in names:
            content = read[name]
            if name in decided or content.content is None:
                continue
            # A compressed copy of a known file (logrotate's compress) is that file: while the original is still
            # there (at its name, or moved in this listing) it is not read; once it is gone, it takes its place.
            original = next((s for s in known.files.values() if s.seq not in copied and rotation_of(s.name, name)
                             and (s.size, s.digest) == content.content and s.lines == content.lines), None)
            if original is None:
                continue
            decided.add(name)
            if at_its_name(original.seq) or original.seq in moved:
                continue
            copied.add(original.seq)
            moved.add(original.seq)
            change.put.append(replace(original, name=name, size=content.size, digest=content.digest,
                                      etag=content.etag, gone=False, rules=RULES))
        for name in names:
            if name not in decided:
                content = read[name]
                change.add_file(name, content.lines, content.size, content.digest, etag=content.etag)
        self._missing_all(region, [s for seq, s in missing.items() if seq not in moved], change, committed)
        return change

    def _identity(self, span: FileSpan) -> tuple[Any, ...] | None:
        return (span.size, span.digest) if span.size else None  # empty files are all alike

    def _locate(self, region: str, span: FileSpan, published: bool) -> FileSpan | None:
        if not span.gone and not published:
            return span  # the last listing saw it (a HEAD per file per epoch would cost more than the LIST)
        info = self.storage.head(f"{region}/{span.name}")
        return span if info is not None and info.size == span.size else None  # put back since? the task checks

    def _region_exists(self, region: str) -> bool:
        return bool(self.storage.list(region, recursive=True))

    # -- the task ------------------------------------------------------------------------------------

    def _read_span(self, region: str, span: FileSpan) -> bytes:
        got = self.storage.read_stream(f"{region}/{span.name}")
        data = None if got is None else b"".join(got[1])
        if got is not None and data is not None and len(data) == span.size \
                and (got[0].etag == span.etag or short_digest(hashlib.sha256(data)) == span.digest):
            return data
        moved = self._find_moved(region, span)  # moved since the plan (and maybe another file took its name)?
        if moved is not None:
            return moved
        if data is None:
            raise RegionalDataLossError(
                f"source=files: file {span.name!r} of region {region!r} (offsets [{span.first_offset}, "
                f"{span.end})) is gone from {self.storage.describe(region)}: it was deleted or changed after its "
                "epoch was planned")
        raise file_changed(region, span, f"{span.size} bytes when first seen, {len(data)} when a task read it"
                           if len(data) != span.size else "same size, other content when a task read it")

    def _find_moved(self, region: str, span: FileSpan) -> bytes | None:
        """The bytes of ``span``'s file under another name of its region, found by size and content (objects
        with its ETag first: a copy keeps the ETag of a single-part object on S3); None if it is nowhere."""
        candidates = [o for o in self.storage.list(region, recursive=True) if o.size == span.size
                      and o.name[len(region) + 1:] != span.name and self.accepts(o.name[len(region) + 1:])]
        candidates.sort(key=lambda o: o.etag != span.etag)
        for other in candidates:
            got = self.storage.read_stream(other.name)
            data = None if got is None else b"".join(got[1])
            if data is not None and short_digest(hashlib.sha256(data)) == span.digest:
                return data
        return None
