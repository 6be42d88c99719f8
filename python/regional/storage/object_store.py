"""S3, GCS and Azure through obstore (the Python binding of the Rust ``object_store`` crate that delta-rs
uses: one configuration and one credential chain for regional's own objects and its Delta tables).

No rename and no lock: ``write`` is one PUT (atomic, read-after-write consistent), ``create`` a conditional PUT
(``If-None-Match: *``), and the fence a lease object: created with a conditional PUT, renewed every
``fence_expiry_s / 3`` by a thread with ``If-Match`` on its ETag, so that a second driver's takeover (a
conditional PUT on the ETag it saw unchanged for ``fence_expiry_s``) makes the first one's next renewal fail.
The driver that lost it learns at its next renewal or ``check_fence``, whichever comes first. Expiry is
judged by the waiting driver's own clock, from when it first saw the ETag: clocks of two hosts are never
compared.

Transient errors (5xx, dropped connections): object_store retries the requests it knows to be idempotent, but
gives up at once on a conditional PUT, a bulk delete, or a connection dropped after the request was sent. Every
call made here is safe to repeat (a create compares the bytes it finds with its own; a lease PUT refused after a
retry checks whether its own first try landed), so ``_retrying`` repeats them, with back-off, for up to
``REGIONAL_STORE_RETRY_S`` (default 60 s), as Hadoop's S3A does for Spark's own checkpoint files.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    InvalidPathError,
    NotSupportedError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
    UnknownConfigurationKeyError,
)

from regional.errors import RegionalStoreError
from regional.location import Location
from regional.storage import config
from regional.storage.base import FenceLost, ObjectInfo, ObjectWriter, Storage, decode_holder

# A lease not renewed for this long is taken over. Tests shorten it through the environment.
LEASE_TTL_S = float(os.environ.get("REGIONAL_LEASE_TTL_S", "30"))
HEAD_THREADS = 32
STREAM_CHUNK = 8 << 20
RETRY_S = float(os.environ.get("REGIONAL_STORE_RETRY_S", "60"))
# Answers, not faults: retrying them would only repeat them.
_ANSWERS = (FileNotFoundError, AlreadyExistsError, PreconditionError, PermissionDeniedError, UnauthenticatedError,
            InvalidPathError, NotSupportedError, UnknownConfigurationKeyError)
T = TypeVar("T")
_stores: dict[tuple[str, str, str], Any] = {}  # (scheme, container, options) -> the obstore store, per process
_stores_lock = threading.Lock()
_leases: dict[str, _Lease] = {}  # fences this process holds, by full location
_seen: dict[str, tuple[str, float]] = {}  # fences held by others: (ETag, monotonic time first seen)


# What object_store says of a fault worth another try: a server error, throttling, a connection that failed.
_TRANSIENT = re.compile(r"status 5\d\d|status 429|SlowDown|error sending request|connection|"
                        r"timed out|timeout|reset by peer|broken pipe|incomplete|error decoding response body",
                        re.IGNORECASE)


def _transient(exc: Exception) -> bool:
    return not isinstance(exc, _ANSWERS) and bool(_TRANSIENT.search(str(exc)))


def _retrying(call: Callable[[], T]) -> T:
    """``call()``, repeated after transient errors (``_transient``) with back-off for ``RETRY_S``; anything else
    (403, a missing bucket, a wrong region...) fails at once."""
    deadline, delay = time.monotonic() + RETRY_S, 0.2
    while True:
        try:
            return call()
        except Exception as exc:
            if not _transient(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def open(location: Location) -> ObjectStorage:  # the backend's entry point
    return ObjectStorage(location)


def _store(location: Location) -> Any:
    options = config.object_store_options(location)
    key = (location.scheme, location.container, json.dumps(options, sort_keys=True))
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store_options, client = config.split_client_options(options)
            if location.scheme == "s3":
                from obstore.store import S3Store
                store = S3Store(location.container, config=cast(Any, store_options or None),
                                client_options=cast(Any, client or None))
            elif location.scheme == "gs":
                from obstore.store import GCSStore
                store = GCSStore(location.container, config=cast(Any, store_options or None),
                                client_options=cast(Any, client or None))
            else:
                from obstore.store import AzureStore
                container, _at, host = location.container.partition("@")
                store = AzureStore(container, account_name=host.split(".")[0], config=cast(Any, store_options or None),
                                   client_options=cast(Any, client or None))
            _stores[key] = store
        return store


class ObjectStorage(Storage):
    @property
    def fence_expiry_s(self) -> float:  # read at each use: tests shorten LEASE_TTL_S
        return LEASE_TTL_S

    def __init__(self, root: Location, store: Any = None) -> None:
        super().__init__(root)
        self.store = store if store is not None else _store(root)

    def child(self, name: str) -> ObjectStorage:
        return ObjectStorage(self.root.child(name), self.store)  # the same bucket: the same client

    def key(self, name: str) -> str:
        return self.root.child(name).path

    def _fail(self, what: str, name: str, exc: Exception) -> RegionalStoreError:
        # obstore's messages name the request (URL, status), never the credentials.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return RegionalStoreError(f"cannot {what} {self.describe(name)}: {first}")

    def read(self, name: str) -> bytes | None:
        got = self._get(name)
        return None if got is None else got[0]

    def _get(self, name: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag, from one GET; None when it does not exist."""
        def whole() -> tuple[bytes, str] | None:
            got = self.read_stream(name)
            return None if got is None else (b"".join(got[1]), got[0].etag)

        return _retrying(whole)

    def head(self, name: str) -> ObjectInfo | None:
        try:
            meta = _retrying(lambda: obstore.head(self.store, self.key(name)))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._fail("read", name, exc) from None
        return _info(name, meta)

    def heads(self, names: list[str]) -> dict[str, ObjectInfo | None]:
        if len(names) < 2:
            return super().heads(names)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(HEAD_THREADS, len(names))) as pool:  # each a round trip: ask at once
            return dict(zip(names, pool.map(self.head, names), strict=True))

    def write(self, name: str, data: bytes) -> None:
        try:
            _retrying(lambda: obstore.put(self.store, self.key(name), data))
        except Exception as exc:
            raise self._fail("write", name, exc) from None

    def create(self, name: str, data: bytes) -> bool:
        try:
            _retrying(lambda: obstore.put(self.store, self.key(name), data, mode="create"))
            return True
        except AlreadyExistsError:
            # A retried PUT whose first try landed also ends here: the same bytes are this call's.
            return self.read(name) == data
        except Exception as exc:
            raise self._fail("create", name, exc) from None

    def delete(self, name: str) -> None:
        try:
            _retrying(lambda: obstore.delete(self.store, self.key(name)))
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._fail("delete", name, exc) from None

    def list(self, directory: str = "", recursive: bool = False) -> list[ObjectInfo]:
        prefix = self.key(directory)
        base = len(self.root.path) + 1 if self.root.path else 0
        try:
            if recursive:
                metas: Any = _retrying(lambda: [
                    m for chunk in obstore.list(self.store, prefix + "/" if prefix else None) for m in chunk])
            else:
                metas = _retrying(lambda: obstore.list_with_delimiter(
                    self.store, prefix + "/" if prefix else None)["objects"])
        except Exception as exc:
            raise self._fail("list", directory, exc) from None
        return [_info(str(m["path"])[base:], m) for m in metas]

    def read_stream(self, name: str) -> tuple[ObjectInfo, Iterator[bytes]] | None:
        try:
            result = obstore.get(self.store, self.key(name))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._fail("read", name, exc) from None

        def chunks() -> Iterator[bytes]:
            try:
                for chunk in result.stream(min_chunk_size=STREAM_CHUNK):
                    yield bytes(chunk)
            except Exception as exc:  # the connection dropped mid-object (after object_store's retries)
                raise self._fail("read", name, exc) from None

        return _info(name, result.meta), chunks()

    def open_writer(self, name: str) -> ObjectWriter:
        return _ObjectWriter(obstore.open_writer(self.store, self.key(name)))

    # -- the fence: a lease ---------------------------------------------------------------------

    def try_fence(self, name: str, holder: dict[str, Any]) -> dict[str, Any] | None:
        where = self.describe(name)
        if where in _leases and _leases[where].held():
            return None
        body = {**holder, "lease_ttl_s": LEASE_TTL_S}
        sent = time.monotonic()  # the lease counts from before the request (a retried one may have landed first)
        try:
            result = _retrying(lambda: obstore.put(self.store, self.key(name), _encode(body), mode="create"))
            self._hold(name, body, str(result["e_tag"]), sent)
            return None
        except AlreadyExistsError:
            pass
        except Exception as exc:
            raise self._fail("create the lease", name, exc) from None
        current = self._get(name)
        if current is None:
            return {}  # removed a moment ago: the next call creates it
        raw, etag = current
        theirs = decode_holder(raw)
        if theirs == body:  # our own PUT landed on a try whose answer was lost
            self._hold(name, body, etag, sent)
            return None
        if theirs.get("released"):  # its holder ended cleanly: take it at once, unless someone else just did
            return self._take_over(name, body, etag, theirs)
        now = time.monotonic()
        seen = _seen.get(where)
        if seen is None or seen[0] != etag:
            _seen[where] = (etag, now)  # renewed (or new) since we last looked: its holder is alive
            return theirs
        ttl = max(LEASE_TTL_S, float(theirs.get("lease_ttl_s", LEASE_TTL_S) or LEASE_TTL_S))
        if now - seen[1] < ttl:
            return theirs
        return self._take_over(name, body, etag, theirs)  # unrenewed for a whole lease: its holder is gone

    def _take_over(self, name: str, body: dict[str, Any], etag: str, theirs: dict[str, Any]) -> dict[str, Any] | None:
        """Replace the lease whose ETag is ``etag`` with ours, unless someone else just did."""
        _seen.pop(self.describe(name), None)
        sent = time.monotonic()
        try:
            result = _retrying(lambda: obstore.put(self.store, self.key(name), _encode(body), mode={"e_tag": etag}))
        except (PreconditionError, FileNotFoundError):
            ours = self._lease_etag_if_holding(name, body)  # our own retried PUT had landed
            if ours is not None:
                self._hold(name, body, ours, sent)
                return None
            return theirs
        except Exception as exc:
            raise self._fail("take over the lease", name, exc) from None
        self._hold(name, body, str(result["e_tag"]), sent)
        return None

    def _lease_etag_if_holding(self, name: str, body: dict[str, Any]) -> str | None:
        """A lease PUT refused as if another driver got there first may be our own retried PUT whose first try
        landed: the lease's ETag if it holds exactly ``body`` (a token per driver), else None (another's, or
        unreadable now)."""
        try:
            current = self._get(name)
        except Exception:
            return None
        return current[1] if current is not None and decode_holder(current[0]) == body else None

    def _hold(self, name: str, body: dict[str, Any], etag: str, sent: float) -> None:
        where = self.describe(name)
        _leases[where] = _Lease(self, name, body, etag, sent)

    def check_fence(self, name: str) -> None:
        lease = _leases.get(self.describe(name))
        if lease is None or not lease.held():  # lost, or released by another run of this process
            raise FenceLost(
                f"this driver's lease {self.describe(name)} on the query's checkpoint was lost "
                f"({lease.why if lease is not None else 'released'}): "
                "another driver may be running the query. This one stops before it publishes anything more; "
                "start the query again once the other has stopped")

    def fence_holder(self, name: str) -> dict[str, Any] | None:
        raw = self.read(name)
        holder = None if raw is None else decode_holder(raw)
        return None if holder is None or holder.get("released") else holder

    def release_fence(self, name: str) -> None:
        lease = _leases.pop(self.describe(name), None)
        if lease is not None:
            lease.release()


class _Lease:
    """A held lease and the thread that renews it."""

    def __init__(self, storage: ObjectStorage, name: str, body: dict[str, Any], etag: str, sent: float) -> None:
        self.storage, self.name, self.body, self.etag = storage, name, body, etag
        self.renewed = sent  # from before the first try of the PUT that took it: it may have landed then
        self.lost = False
        self.why = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="regional-lease", daemon=True)
        self._thread.start()
        atexit.register(self.release)

    def held(self) -> bool:
        if not self.lost and time.monotonic() - self.renewed >= LEASE_TTL_S:
            self.lost, self.why = True, f"not renewed for {LEASE_TTL_S:.0f} s"
        return not self.lost

    def _run(self) -> None:
        while not self._stop.wait(LEASE_TTL_S / 3):
            if not self.held():
                return
            # The lease counts from before the request: a slow answer must not stretch it past the waiter's view.
            sent = time.monotonic()
            body = {**self.body, "renewed_at": time.time()}
            try:
                result = obstore.put(self.storage.store, self.storage.key(self.name), _encode(body),
                                     mode={"e_tag": self.etag})
            except (PreconditionError, FileNotFoundError):
                etag = self.storage._lease_etag_if_holding(self.name, body)
                if etag is None:
                    self.lost, self.why = True, "another driver replaced it"
                    return
                self.etag, self.renewed = etag, sent
                continue
            except Exception:  # transient: renew again next time; held() turns it lost at expiry
                continue
            self.etag, self.renewed = str(result["e_tag"]), sent

    def release(self) -> None:
        """At a clean end: mark the lease released if it is still ours (a conditional PUT on its ETag, so that a
        driver that took it over meanwhile keeps it), so that the next run need not wait it out."""
        self._stop.set()
        if not self.held():
            return
        self.lost, self.why = True, "released"
        released = {"released": True, "token": self.body.get("token"), "released_at": time.time()}
        with contextlib.suppress(Exception):  # not ours any more, or the store is unreachable: it expires
            obstore.put(self.storage.store, self.storage.key(self.name), _encode(released),
                        mode={"e_tag": self.etag})


class _ObjectWriter(ObjectWriter):
    """obstore's writable file, with the position pyarrow asks for."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.position = 0
        self.discarded = False

    def write(self, data: Any) -> int:
        n = int(self.file.write(data))
        self.position += n
        return n

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        pass  # obstore uploads in parts of its own size; flushing a small part would fail the upload

    @property
    def closed(self) -> bool:
        return bool(self.discarded or self.file.closed())

    def close(self) -> None:
        if not self.discarded and not self.file.closed():
            self.file.close()

    def discard(self) -> None:
        # Not closed, the upload is never completed: no object appears (a started multipart upload is left to
        # the bucket's lifecycle rule for incomplete uploads).
        self.discarded = True


def _info(name: str, meta: Any) -> ObjectInfo:
    return ObjectInfo(name, int(meta["size"]), meta["last_modified"].timestamp(), str(meta.get("e_tag") or ""))


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True).encode()
