"""What every storage implements: objects under one root location, named by '/'-separated keys.

A ``Storage`` is a small value: it is built where it is used (on the driver for the store, in tasks for a
target's files) from a ``Location`` and the storage settings of that process (``storage.config``), and it
holds no open connection that must be closed. Every method runs where it is called.

The guarantees the store is built on, which every implementation must give:

- ``write`` replaces an object whole: a reader sees the old bytes or the new, never a part (a local file is
  written aside and renamed; an object store's PUT is atomic and read-after-write consistent);
- ``create`` writes only if the object is absent, and of two creators exactly one wins (a hard link locally;
  ``If-None-Match: *`` on S3, a generation precondition on GCS, ``If-None-Match`` on Azure);
- a missing object is ``None`` from ``read``, never an empty value;
- the fence: one process at a time holds a named fence (``try_fence``) for as long as it lives; a process that
  died releases it, at once (a local ``flock``) or after ``fence_expiry_s`` (an object store lease).
"""

from __future__ import annotations

import io
import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from regional.errors import RegionalStoreError
from regional.location import Location


class FenceLost(RegionalStoreError):
    """This process held the fence and lost it: another driver took over (or could have). Nothing more may be
    published from here."""


@dataclass(frozen=True)
class ObjectInfo:
    name: str  # relative to the storage's root
    size: int
    modified: float  # seconds since the epoch
    etag: str = ""  # changes whenever the object is written again; "" where the storage has none (local files)


class Storage(ABC):
    """The objects under ``root``."""

    @property
    def fence_expiry_s(self) -> float:
        """How long the fence of a process that died without releasing it outlives it: 0 where the operating
        system releases it with the process."""
        return 0.0

    def __init__(self, root: Location) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    def describe(self, name: str = "") -> str:
        """The full location of ``name``, for messages (never holds a credential)."""
        return str(self.root.child(name))

    @abstractmethod
    def child(self, name: str) -> Storage:
        """The storage of the objects under ``name``."""

    @abstractmethod
    def read(self, name: str) -> bytes | None:
        """The object's bytes; None when it does not exist."""

    def read_stream(self, name: str) -> tuple[ObjectInfo, Iterator[bytes]] | None:
        """The object's info and its bytes in chunks, from one read (one GET of one version on an object store),
        for objects too large to hold at once; None when it does not exist. Default: one chunk, whole."""
        data = self.read(name)
        info = None if data is None else self.head(name)
        if data is None or info is None:
            return None
        return ObjectInfo(name, len(data), info.modified, info.etag), iter([data])

    @abstractmethod
    def head(self, name: str) -> ObjectInfo | None:
        """The object's size and time, without its bytes; None when it does not exist."""

    def heads(self, names: list[str]) -> dict[str, ObjectInfo | None]:
        """``head`` of each name. Default: one after the other; a remote store asks in parallel."""
        return {name: self.head(name) for name in names}

    @abstractmethod
    def write(self, name: str, data: bytes) -> None:
        """Create or replace the object, whole (see the module's guarantees)."""

    @abstractmethod
    def create(self, name: str, data: bytes) -> bool:
        """Write the object only if it does not exist; True if this call created it. An object store may also
        answer True when the object holds exactly ``data``: its client retries a PUT whose answer was lost,
        and the retry finds the first try's object (the same bytes: the same decision)."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove the object; nothing if it does not exist."""

    @abstractmethod
    def list(self, directory: str = "", recursive: bool = False) -> list[ObjectInfo]:
        """The objects in ``directory`` (and below it, if ``recursive``), names relative to the root; empty if
        there is none. Names of a local directory's subdirectories are not objects and are not listed."""

    def delete_tree(self, directory: str) -> None:
        """Remove every object in and below ``directory``."""
        for info in self.list(directory, recursive=True):
            self.delete(info.name)

    @abstractmethod
    def open_writer(self, name: str) -> ObjectWriter:
        """A binary file to write the object through; it exists, whole, once the file is closed. ``discard``
        it instead to leave nothing behind."""

    def discard(self, writer: ObjectWriter) -> None:
        """Abandon a writer from ``open_writer``: the object is not created."""
        writer.discard()

    # -- the fence -----------------------------------------------------------------------

    @abstractmethod
    def try_fence(self, name: str, holder: dict[str, Any]) -> dict[str, Any] | None:
        """Take the fence ``name`` for this process and record ``holder`` in it, or say who holds it (their
        ``holder``; ``{}`` when unreadable). Called again while it is held by another, so that an object store
        can see a dead holder's lease stay unrenewed for ``fence_expiry_s``."""

    def check_fence(self, name: str) -> None:
        """Raise ``FenceLost`` if this process took the fence ``name`` and no longer holds it. Default: a fence
        lasts as long as its process."""

    def release_fence(self, name: str) -> None:
        """At a clean end: give up the fence ``name`` if this process holds it. Default: the process's end does."""

    @abstractmethod
    def fence_holder(self, name: str) -> dict[str, Any] | None:
        """Who holds (or last held) the fence ``name``, as recorded by its ``try_fence``; None if never taken."""


class ObjectWriter(io.RawIOBase, ABC):
    """What ``open_writer`` returns: a binary file (pyarrow writes parquet into it) whose object appears, whole,
    only when it is closed."""

    def writable(self) -> bool:
        return True

    @abstractmethod
    def tell(self) -> int: ...

    @abstractmethod
    def discard(self) -> None:
        """Stop writing: the object never appears."""

    def __del__(self) -> None:
        # Dropped without close() (a task that failed mid-write): nothing may appear under the final name.
        if not self.closed:
            self.discard()


def decode_holder(raw: bytes) -> dict[str, Any]:
    """A fence's holder record as ``try_fence`` wrote it; ``{}`` when it is unreadable."""
    try:
        holder = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}
