"""Local files (and mounted ones): ``write`` goes to a hidden temporary file, fsync, rename, fsync of the
directory; ``create`` hard-links the temporary file into place (fails if the name exists); the fence is an
``flock`` that the kernel releases when the process ends, however it ends."""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from pathlib import Path
from typing import Any

from regional.errors import RegionalStoreError
from regional.location import Location
from regional.storage.base import ObjectInfo, ObjectWriter, Storage, decode_holder

_locks: dict[str, int] = {}  # fence files this process holds, and their descriptors


def open(location: Location) -> LocalStorage:  # the backend's entry point
    return LocalStorage(location)


class LocalStorage(Storage):
    def __init__(self, root: Location) -> None:
        super().__init__(root)
        self.path = root.local_path()

    def child(self, name: str) -> LocalStorage:
        return LocalStorage(self.root.child(name))

    def _file(self, name: str) -> Path:
        return Path(self.root.child(name).path)

    def read(self, name: str) -> bytes | None:
        try:
            return self._file(name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RegionalStoreError(f"cannot read {self.describe(name)}: {exc}") from None

    def head(self, name: str) -> ObjectInfo | None:
        try:
            stat = self._file(name).stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RegionalStoreError(f"cannot read {self.describe(name)}: {exc}") from None
        return ObjectInfo(name, stat.st_size, stat.st_mtime)

    def heads(self, names: list[str]) -> dict[str, ObjectInfo | None]:
        """``head`` of each; plain names (an epoch's data files, thousands at a time) skip the location parsing."""
        base = str(self.path)
        found: dict[str, ObjectInfo | None] = {}
        for name in names:
            if "/" in name or name in (".", "..", ""):
                found[name] = self.head(name)
                continue
            try:
                stat = os.stat(os.path.join(base, name))
            except FileNotFoundError:
                found[name] = None
            except OSError as exc:
                raise RegionalStoreError(f"cannot read {self.describe(name)}: {exc}") from None
            else:
                found[name] = ObjectInfo(name, stat.st_size, stat.st_mtime)
        return found

    def write(self, name: str, data: bytes) -> None:
        path = self._file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _write_temporary(path, data)
        os.replace(tmp, path)
        _fsync_dir(path.parent)

    def create(self, name: str, data: bytes) -> bool:
        path = self._file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _write_temporary(path, data)
        try:
            os.link(tmp, path)  # fails if path exists: atomic create-if-absent
            _fsync_dir(path.parent)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, name: str) -> None:
        self._file(name).unlink(missing_ok=True)

    def list(self, directory: str = "", recursive: bool = False) -> list[ObjectInfo]:
        base = self._file(directory)
        found: list[ObjectInfo] = []
        prefix = "/".join(p for p in directory.split("/") if p)
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return []
        for entry in entries:
            name = f"{prefix}/{entry.name}" if prefix else entry.name
            if entry.is_dir(follow_symlinks=False):
                if recursive:
                    found.extend(self.list(name, recursive=True))
                continue
            try:
                stat = entry.stat()
            except FileNotFoundError:
                continue  # removed since it was listed
            found.append(ObjectInfo(name, stat.st_size, stat.st_mtime))
        return found

    def delete_tree(self, directory: str) -> None:
        super().delete_tree(directory)
        for root, dirs, _files in os.walk(self._file(directory), topdown=False):  # the emptied directories
            for d in dirs:
                _rmdir(os.path.join(root, d))
        _rmdir(str(self._file(directory)))

    def open_writer(self, name: str) -> ObjectWriter:
        path = self._file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        return _LocalWriter(path)

    # -- the fence: flock ---------------------------------------------------------------

    def try_fence(self, name: str, holder: dict[str, Any]) -> dict[str, Any] | None:
        path = self._file(name)
        key = str(path)
        if key in _locks:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            current = decode_holder(os.pread(fd, 4096, 0))
            os.close(fd)
            return current
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        os.fsync(fd)
        _locks[key] = fd
        return None

    def fence_holder(self, name: str) -> dict[str, Any] | None:
        raw = self.read(name)
        return None if raw is None else decode_holder(raw)


class _LocalWriter(ObjectWriter):
    """A file written aside under a hidden name and renamed into place when closed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
        self.file = self.tmp.open("wb")

    def write(self, data: Any) -> int:
        return self.file.write(data)

    def tell(self) -> int:
        return self.file.tell()

    def flush(self) -> None:
        self.file.flush()

    @property
    def closed(self) -> bool:
        return self.file.closed

    def close(self) -> None:
        if self.file.closed:
            return
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)


def _write_temporary(path: Path, data: bytes) -> Path:
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass  # not empty (a file arrived), or gone
