"""``source=files`` on a local (or mounted) file system: listing a region's directory tree, and the identity of a
file (its inode): a rename (``mv``) is recognised, a copy is new input. The rules are in
``regional.inputs.files``' docstring."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from regional.errors import RegionalConfigError, RegionalDataLossError
from regional.ids import validate_region_id
from regional.inputs.files.lines import CorruptFile, LineFormat, codec_of
from regional.inputs.files.manifest import (
    RULES,
    FileSpan,
    Fingerprint,
    RegionChange,
    RegionFiles,
    file_changed,
    is_hidden,
    rotation_of,
    short_digest,
)
from regional.inputs.files.source import FilesInput
from regional.location import Location

log = logging.getLogger("regional")

READ_CHUNK = 8 << 20
# Driver threads that fingerprint a listing's new files (SHA-256 and lines; both release the GIL), each holding
# one READ_CHUNK: CPU work, so no more than the cores; and only when the new files hold this much.
FINGERPRINT_THREADS = min(4, os.cpu_count() or 1)
PARALLEL_FINGERPRINT_BYTES = 4 << 20


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
    format: LineFormat
    fingerprints: dict[str, Fingerprint | None] = field(default_factory=dict)

    def fingerprint(self, name: str) -> Fingerprint | None:
        """The file's fingerprint as read for this listing (``LocalFiles._fingerprint_new``), or read now."""
        if name in self.fingerprints:
            return self.fingerprints.pop(name)  # read once per listing, as before: a second look reads again
        return _fingerprint_or_none(self.directory / name, self.format)


class LocalFiles(FilesInput):
    """The files source on a local (or mounted) file system: a file's identity is its inode, so a rename
    (``mv``) is recognised and a copy is new input."""

    def __init__(self, location: Location, line_format: LineFormat | None = None,
                 name_glob: str | None = None, partition_dirs: bool = False) -> None:
        super().__init__(location, line_format, name_glob, partition_dirs)
        self.root = location.local_path()

    def regions(self) -> list[str]:
        if not self.root.is_dir():
            raise RegionalConfigError(f"source=files: path {self.root} is not a directory")
        root_real = os.path.realpath(self.root)
        found = []
        for entry in os.scandir(self.root):
            if is_hidden(entry.name):
                continue
            if not entry.is_dir():
                if entry.is_file():  # Spark's text source would read it: never leave it unread in silence
                    raise RegionalConfigError(
                        f"source=files: {entry.name!r} is a file directly under path {self.root}, where only region "
                        "directories belong (path/<region>/<files>): its records would be read by no region. Move "
                        f"it into a region's directory (e.g. {self.root}/<region>/{entry.name}), or hide it with a "
                        "leading '.' or '_'")
                continue
            if "=" in entry.name:
                raise RegionalConfigError(
                    f"source=files: {entry.name!r} under {self.root} looks like a partition directory (key=value), "
                    "but the directories directly under path are regions (path/<region>/...): give the path of "
                    f"the directory above the regions (partition directories belong inside a region: "
                    f"path/<region>/{entry.name}/...), or rename it if it is a region")
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
                listing[region] = _LocalListing(self.root / region, _visible_files(self.root / region, self.accepts),
                                                self.format)
            except (FileNotFoundError, NotADirectoryError):
                continue  # the directory vanished since the listing of regions
        self._fingerprint_new(listing)
        return listing

    def _names(self, listing: _LocalListing) -> Iterable[str]:
        return listing.files.keys()

    def _file_names(self) -> Iterator[tuple[str, str]]:
        for region in self.regions():
            try:
                names = sorted(_visible_files(self.root / region, self.accepts))
            except (FileNotFoundError, NotADirectoryError):
                continue  # the directory vanished since the listing of regions
            yield from ((region, name) for name in names)

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
                again = _LocalListing(listed.directory, _visible_files(listed.directory, self.accepts), self.format)
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
        looked: list[tuple[str, Fingerprint]] = []
        for name in new_names:
            fp = listed.fingerprint(name)
            if fp is None:
                vanished = True
                continue  # gone while looked at: the next listing sees it, or not
            looked.append((name, fp))
        decided: set[str] = set()
        for name, fp in looked:  # renames first: a compressed copy is judged knowing where every original is now
            found = self._match_missing(region, name, fp, missing, renamed, committed, directory)
            if found is not None:
                renamed.add(found.seq)
                decided.add(name)
                change.put.append(replace(found, name=name, inode=fp.inode, mtime_ns=fp.mtime_ns, gone=False))
        copied: set[int] = set()
        for name, fp in looked:
            if name in decided or fp.content is None:
                continue
            # A compressed copy of a known file (logrotate's compress) is that file: while the original is still
            # there (under its name, or renamed in this listing) it is not read; once it is gone, it takes its place.
            original = next((s for s in known.files.values() if s.seq not in copied and rotation_of(s.name, name)
                             and (s.size, s.digest) == fp.content and s.lines == fp.lines), None)
            if original is None:
                continue
            decided.add(name)
            if original.seq in live or original.seq in renamed:
                self._warn_once(region, name, "is %r compressed (offsets [%d, %d)): the same records, not read "
                                "twice; it takes that file's place once the file is gone", original.name,
                                original.first_offset, original.end)
                continue
            copied.add(original.seq)
            renamed.add(original.seq)
            change.put.append(replace(original, name=name, size=fp.size, digest=fp.digest, inode=fp.inode,
                                      mtime_ns=fp.mtime_ns, gone=False, rules=RULES))
        for name, fp in looked:
            if name not in decided:
                change.add_file(name, fp.lines, fp.size, fp.digest, fp.inode, fp.mtime_ns)
        if not vanished:
            self._missing_all(region, [s for seq, s in missing.items() if seq not in renamed], change, committed)
        # else a file went between the listing and the look at its content: a rename in flight, perhaps of a
        # missing file, whose new name this listing could not see. Nothing is marked missing or dropped from such a
        # listing (a processed file renamed twice across two listings was dropped, then read again as new).
        return change

    def _warn_once(self, region: str, name: str, message: str, *args: Any) -> None:
        if (region, name) not in self._warned:
            self._warned.add((region, name))
            log.warning("regional: source=files: region %r: %r " + message, region, name, *args)

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
        return _locate(self.root / region, span, self.accepts)

    def _region_exists(self, region: str) -> bool:
        return (self.root / region).is_dir()

    def _read_span(self, region: str, span: FileSpan) -> bytes:
        return _read_span(self.root / region, region, span, self.accepts)




def _locate(directory: Path, span: FileSpan, accepts: Callable[[str], bool]) -> FileSpan | None:
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
        for name, other in _visible_files(directory, accepts).items():
            if (other.st_ino, other.st_size) == (span.inode, span.size):
                return replace(span, name=name)
    except FileNotFoundError:
        pass
    return span if st is not None and st.st_size == span.size else None


def _visible_files(directory: Path, accepts: Callable[[str], bool]) -> dict[str, os.stat_result]:
    """The visible files under ``directory``, at any depth, by their path under it (``/``-separated), and their
    stats; a file renamed or deleted while listed is left out, and so is a directory that goes while listed.
    A hidden directory (``.`` or ``_`` first, unless ``_key=value``) hides what it holds; ``accepts`` says which
    files are input. A directory reached twice (through a link) is listed once."""
    found: dict[str, os.stat_result] = {}
    seen: set[tuple[int, int]] = set()

    def walk(folder: str, prefix: str) -> None:
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            if not prefix:
                raise  # the region's directory itself: the caller decides
            return
        for e in entries:
            if is_hidden(e.name):
                continue
            name = prefix + e.name
            try:
                if e.is_dir():
                    st = e.stat()
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        walk(e.path, name + "/")
                elif e.is_file() and accepts(name):
                    found[name] = e.stat()
            except FileNotFoundError:
                continue

    walk(str(directory), "")
    return found


def _read_span(directory: Path, region: str, span: FileSpan, accepts: Callable[[str], bool]) -> bytes:
    """The bytes of ``span``'s file, checked to be the file the driver counted (size, and content unless inode
    and modification time are unchanged)."""
    located = _locate(directory, span, accepts)
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




def _fingerprint_or_none(path: Path, line_format: LineFormat) -> Fingerprint | None:
    """Size, lines, identity and SHA-256 of a file, read once in chunks; None if it is gone."""
    try:
        with open(path, "rb") as f:
            size, lines, digest, content = line_format.fingerprint(path.name, iter(lambda: f.read(READ_CHUNK), b""))
            st = os.fstat(f.fileno())
    except FileNotFoundError:
        return None
    except CorruptFile as exc:
        raise RegionalConfigError(
            f"source=files: file {path} is {exc}, though its name ends as a {codec_of(path.name)} file's: "
            "Spark's text source fails on it too, and its records cannot be read. Move it out of path (or give it "
            "a name starting with '.' or '_'), and write it again, whole, under a new name (an unfinished file "
            "belongs under a hidden name until it is complete)") from None
    if st.st_size != size:
        raise RegionalConfigError(
            f"source=files: file {path} changed while its lines were counted ({size} bytes read, {st.st_size} "
            "now): a visible file must never change. Write each file under a name starting with '.' or '_' and "
            "rename it when it is complete")
    return Fingerprint(size, lines, st.st_ino, st.st_mtime_ns, digest, content)




def _fingerprint_share(share: list[tuple[_LocalListing, str, int]]) -> None:
    """One thread's files of ``LocalFiles._fingerprint_new``; a file it cannot read is left for ``_scan``."""
    for found, name, _size in share:
        try:
            found.fingerprints[name] = _fingerprint_or_none(found.directory / name, found.format)
        except Exception:  # _scan reads it again, and raises what a listing raised before, in its order
            continue




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

