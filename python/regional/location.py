"""The one parser of the locations regional is given: the checkpoint, the files source's ``path``, the Delta
target's ``path`` and ``deadLetterPath``.

A location is a local path or a ``file:`` URI (``file:/dir``, ``file:///dir``); it is made absolute, since
Spark's tasks and driver may run in other working directories. Any other scheme (``s3a://``, ``hdfs://``)
is refused with an error naming the option: regional's own reads and writes are local file operations.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from regional.errors import RegionalConfigError

# ``file:`` (any case; ``file:x`` is relative), or another scheme followed by a slash (``s3a://b/k``). A colon
# elsewhere (``data:2024/x``) is part of a name.
_SCHEME = re.compile(r"^(file(?=:)|[A-Za-z][A-Za-z0-9+.-]*(?=:/)):", re.IGNORECASE)


def local_path(key: str, value: str | os.PathLike[str]) -> Path:
    """``value`` (given as option ``key``) as an absolute local path."""
    text = os.fspath(value).strip()
    if not text:
        raise RegionalConfigError(f"{key} is empty: give a directory")
    scheme = _SCHEME.match(text)
    if scheme is not None:
        if scheme.group(1).lower() != "file":
            raise RegionalConfigError(
                f"{key}={text!r}: only local paths (or file:) are supported, not {scheme.group(1)}:; regional reads "
                "and writes it with local file operations: give a directory on the local file system, or a mounted "
                "one that the driver and every executor can reach")
        text = re.sub(r"^file:(//)?", "", text, flags=re.IGNORECASE)
    return Path(os.path.abspath(text))


def optional_local_path(key: str, value: str | None) -> str | None:
    """Like ``local_path``, for an optional setting: empty means not set (None)."""
    if value is None or not value.strip():
        return None
    return str(local_path(key, value))
