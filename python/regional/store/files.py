"""The store's file format: every file versioned, checksummed and written whole.

Files are read and written through the store's ``regional.storage.Storage``. A store file is two lines::

    regional <kind> v<version> sha256=<hex digest of line 2>
    <JSON>

A torn write, a flipped bit, a file of another kind or an unknown version is a
clear ``RegionalStoreError`` naming the file, never a silent default. A missing
file is ``None``: the caller decides what its absence means, and it never
means "done". The JVM shim writes and reads the same format.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from regional.errors import NEW_QUERY, RegionalStoreError
from regional.storage import Storage

VERSIONS: dict[str, int] = {
    "query": 1,  # query.json: the query id
    "epoch": 2,  # epochs/<n>.json: an epoch record (v2: region states and slices as columns)
    "intent": 2,  # intents/<n>.json: phase two as decided (v2: its record in the epoch record's v2)
    "write-options": 1,  # write-options.json: writeStream's regional settings, recorded at query start
    "latest-offsets": 1,  # latest-offsets.json: each region's end (and log start) as the source last saw it
    "starting-offsets": 1,  # starting-offsets.json: where the regions of a new query start
    "final-epoch-request": 1,  # final-epoch-request.json: a graceful stop asks for a final global epoch
    "referenced-epochs": 1,  # referenced-epochs: the live ref_epochs, read by the JVM shim
    "query-plan": 1,  # query-plan.json: the JVM shim's plan check
    "failure": 1,  # failures/<epoch>/<partition>-<attempt>.json: the JVM shim's record of a failed attempt
    "source-log": 1,  # sources/<source>/<seq>.{snapshot,delta}.json: a source's own state (the files manifest)
    "status": 1,  # status.json: the read model as of a recorded epoch, for the JVM shim's Spark UI tab and metrics
}
# Older formats this version still reads (a checkpoint written before an upgrade); it writes VERSIONS only.
ALSO_READS: dict[str, tuple[int, ...]] = {"epoch": (1,), "intent": (1,)}


def encode(kind: str, data: Any) -> bytes:
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    header = f"regional {kind} v{VERSIONS[kind]} sha256={hashlib.sha256(body).hexdigest()}\n"
    return header.encode("ascii") + body + b"\n"


def decode(where: str, kind: str, raw: bytes) -> Any:
    """The JSON value stored in ``raw`` (the bytes of the file at ``where``), checked."""
    header, newline, rest = raw.partition(b"\n")
    parts = header.decode("ascii", errors="replace").split(" ")
    if not newline or len(parts) != 4 or parts[0] != "regional" or not parts[3].startswith("sha256="):
        raise corrupt(where, "it does not start with a regional store header (torn, or not written by regional)")
    if parts[1] != kind:
        raise corrupt(where, f"it holds a {parts[1]!r} file where a {kind!r} file belongs")
    readable = [f"v{v}" for v in (VERSIONS[kind], *ALSO_READS.get(kind, ()))]
    if parts[2] not in readable:
        raise RegionalStoreError(
            f"the regional store file {where} has format {parts[2]}, and this regional reads {kind} files of "
            f"format {' or '.join(readable)} only: it was written by another version of regional. Run the query "
            "with that version, or " + NEW_QUERY
        )
    body = rest[:-1] if rest.endswith(b"\n") else rest
    if hashlib.sha256(body).hexdigest() != parts[3][len("sha256="):]:
        raise corrupt(where, "its checksum does not match its content (torn or damaged)")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise corrupt(where, f"unreadable JSON: {exc}") from None


def read(storage: Storage, name: str, kind: str) -> Any | None:
    """The value of a store file, or None when the file does not exist."""
    raw = storage.read(name)
    return None if raw is None else decode(storage.describe(name), kind, raw)


def write(storage: Storage, name: str, kind: str, data: Any) -> None:
    """Create or replace the file, whole (``Storage.write``)."""
    storage.write(name, encode(kind, data))


def create_exclusive(storage: Storage, name: str, kind: str, data: Any) -> bool:
    """Write the file only if it does not exist yet (two creators: exactly one wins). True if this one did."""
    return storage.create(name, encode(kind, data))


def corrupt(where: str, why: str) -> RegionalStoreError:
    return RegionalStoreError(
        f"the regional store file {where} is corrupt: {why}. Nothing was published from it. Restore the file "
        "from a backup; otherwise " + NEW_QUERY
    )
