"""The one parser of the locations regional is given: the checkpoint, the files source's ``path``, the Delta
target's ``path`` and ``deadLetterPath``. Pure: it names places, ``regional.storage`` reaches them.

A location is one of:

- a local path or a ``file:`` URI (``file:/dir``, ``file:///dir``), made absolute, since Spark's tasks and
  driver may run in other working directories;
- ``s3://bucket/key`` or ``s3a://bucket/key`` (the same object: users give Spark ``s3a://``);
- ``gs://bucket/key``;
- ``abfss://container@account.dfs.core.windows.net/key`` (or ``abfs://``).

Any other scheme (``hdfs://``) is refused with an error naming the option.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

from regional.errors import RegionalConfigError

# ``file:`` (any case; ``file:x`` is relative), or another scheme followed by a slash (``s3a://b/k``). A colon
# elsewhere (``data:2024/x``) is part of a name.
_SCHEME = re.compile(r"^(file(?=:)|[A-Za-z][A-Za-z0-9+.-]*(?=:/)):", re.IGNORECASE)
# The scheme as written -> the storage it names. s3a/s3n are Hadoop's names for S3.
SCHEMES = {"file": "file", "s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gs", "abfs": "az", "abfss": "az"}
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$")
_AZURE = re.compile(r"^[a-z0-9][a-z0-9\-]{1,62}@[a-z0-9]{3,24}\.(dfs|blob)\.core\.windows\.net$")


@dataclass(frozen=True)
class Location:
    """A place regional reads or writes. ``scheme`` is the storage (``file``, ``s3``, ``gs``, ``az``);
    ``container`` the bucket (``az``: ``container@account.dfs.core.windows.net``), empty for ``file``; ``path``
    the absolute path (``file``) or the key prefix without surrounding slashes. ``str()`` is its one
    canonical spelling (``s3://b/k`` is ``s3a://b/k``, as Spark users write it); ``given`` is what the user wrote."""

    scheme: str
    container: str
    path: str
    given: str = field(default="", compare=False)

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    def local_path(self) -> Path:
        if not self.is_local:
            raise ValueError(f"{self} is not on the local file system")
        return Path(self.path)

    def child(self, name: str) -> Location:
        """The location ``name`` ('/'-separated, relative) below this one."""
        parts = [p for p in name.split("/") if p]
        if not parts:
            return self
        if any(p in (".", "..") for p in parts):
            raise ValueError(f"{name!r} is not a plain relative name")
        path = posixpath.join(self.path, *parts) if self.path else "/".join(parts)
        return Location(self.scheme, self.container, path, "")

    def __str__(self) -> str:
        if self.is_local:
            return self.path
        prefix = {"az": "abfss", "s3": "s3a"}.get(self.scheme, self.scheme)  # as Spark users write them
        return f"{prefix}://{self.container}/{self.path}" if self.path else f"{prefix}://{self.container}"


def parse_location(key: str, value: str | os.PathLike[str]) -> Location:
    """``value``, given as option ``key``, as a location; a clear error naming ``key`` if it is not one."""
    text = os.fspath(value).strip()
    if not text:
        raise RegionalConfigError(f"{key} is empty: give a directory")
    match = _SCHEME.match(text)
    written = match.group(1).lower() if match else "file"
    scheme = SCHEMES.get(written)
    if scheme is None:
        raise RegionalConfigError(
            f"{key}={text!r}: regional reads and writes local paths (or file:), s3:// (s3a://), gs:// and "
            f"abfss:// locations, not {written}:; give one of those, or a mounted directory that the driver and "
            "every executor can reach")
    if scheme == "file":
        local = re.sub(r"^file:(//)?", "", text, flags=re.IGNORECASE)
        return Location("file", "", os.path.abspath(local), text)
    rest = text[match.end():] if match else text
    if not rest.startswith("//"):
        raise RegionalConfigError(f"{key}={text!r}: write it as {written}://<bucket>/<path>")
    container, _slash, key_path = rest[2:].partition("/")
    container = container.lower() if scheme == "az" else container
    pattern = _AZURE if scheme == "az" else _BUCKET
    if not pattern.match(container):
        what = "container@account.dfs.core.windows.net" if scheme == "az" else "bucket name"
        raise RegionalConfigError(f"{key}={text!r}: {container!r} is not a valid {what}")
    parts = [p for p in key_path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise RegionalConfigError(f"{key}={text!r}: '.' and '..' are not allowed in an object store path")
    return Location(scheme, container, "/".join(parts), text)


def optional_location(key: str, value: str | None) -> Location | None:
    """Like ``parse_location``, for an optional setting: empty means not set (None)."""
    if value is None or not value.strip():
        return None
    return parse_location(key, value)


def optional_location_text(key: str, value: str | None) -> str | None:
    """An optional setting's location in its canonical spelling (what plans record); empty means not set."""
    location = optional_location(key, value)
    return None if location is None else str(location)


def same_location(a: str, b: str) -> bool:
    """Whether two location texts name the same place: on local disk, after resolving symbolic links."""
    first, second = parse_location("location", a), parse_location("location", b)
    if first.is_local and second.is_local:
        return os.path.realpath(first.path) == os.path.realpath(second.path)
    return str(first) == str(second)
