"""``regional.storage.object_store`` against an in-memory fake of obstore: what is retried, and the lease's clock
when a retried PUT's first try had landed."""

from __future__ import annotations

import datetime
import itertools
import threading
import time

import pytest
from obstore.exceptions import AlreadyExistsError, PreconditionError

import regional.storage.object_store as backend
from regional.location import parse_location


def test_only_transient_errors_are_retried(monkeypatch):
    monkeypatch.setattr(backend, "RETRY_S", 5.0)
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("Generic S3 error: Error performing PUT ... - HTTP error: error sending request")
        return "done"

    assert backend._retrying(flaky) == "done" and len(calls) == 3
    for message in ("Client error with status 403 Forbidden: AccessDenied",
                    "Client error with status 301 Moved Permanently: PermanentRedirect"):
        calls.clear()

        def refused(message: str = message) -> None:
            calls.append(1)
            raise RuntimeError(message)

        started = time.monotonic()
        with pytest.raises(RuntimeError):
            backend._retrying(refused)
        assert len(calls) == 1 and time.monotonic() - started < 1, message  # at once, not after RETRY_S
    calls.clear()
    with pytest.raises(AlreadyExistsError):
        backend._retrying(lambda: calls.append(1) or (_ for _ in ()).throw(AlreadyExistsError("exists")))
    assert len(calls) == 1


def test_a_lease_whose_first_put_landed_unanswered_is_never_held_by_two_drivers(monkeypatch):
    """Driver A's create lands but its answer is lost, and the store fails for 2.5 s; driver B, watching the
    lease object, takes it over once its ETag has not changed for a TTL. A must have counted its lease from
    before its first try, so that it knows it lost the lease before B can hold it."""
    ttl, fail_until = 3.0, 2.5
    monkeypatch.setattr(backend, "LEASE_TTL_S", ttl)
    objects: dict[str, tuple[bytes, str]] = {}
    etags, lock, t0 = itertools.count(1), threading.Lock(), time.monotonic()
    landed: list[bool] = []

    class Got:
        def __init__(self, data: bytes, etag: str) -> None:
            self.meta = {"size": len(data), "last_modified": datetime.datetime.now(datetime.UTC), "e_tag": etag}
            self.data = data

        def stream(self, min_chunk_size: int = 0):
            yield self.data

    class FakeObstore:
        @staticmethod
        def put(store, key, data, mode=None, who="A"):
            with lock:
                if who == "A" and time.monotonic() - t0 < fail_until:
                    if not landed:
                        landed.append(True)
                        objects[key] = (bytes(data), f"E{next(etags)}")
                    raise RuntimeError("error sending request")
                current = objects.get(key)
                if mode == "create" and current:
                    raise AlreadyExistsError("exists")
                if isinstance(mode, dict) and (not current or current[1] != mode["e_tag"]):
                    raise PreconditionError("etag")
                objects[key] = (bytes(data), f"E{next(etags)}")
                return {"e_tag": objects[key][1]}

        @staticmethod
        def get(store, key):
            with lock:
                if time.monotonic() - t0 < fail_until:
                    raise RuntimeError("error sending request")
                if key not in objects:
                    raise FileNotFoundError(key)
                return Got(*objects[key])

    monkeypatch.setattr(backend, "obstore", FakeObstore)
    storage = backend.ObjectStorage(parse_location("t", "s3a://bucket/ck/regional"), store=object())
    key = storage.key("driver.lock")

    def driver_b() -> None:
        first = None
        while time.monotonic() - t0 < 8:
            with lock:
                current = objects.get(key)
            if current and (first is None or first[0] != current[1]):
                first = (current[1], time.monotonic())
            if first and time.monotonic() - first[1] >= ttl:
                FakeObstore.put(None, key, b'{"token": "B"}', mode={"e_tag": first[0]}, who="B")
                return
            time.sleep(0.02)

    threading.Thread(target=driver_b, daemon=True).start()
    assert storage.try_fence("driver.lock", {"token": "A"}) is None  # A holds it
    both = []
    try:
        while time.monotonic() - t0 < 6:
            try:
                storage.check_fence("driver.lock")
            except backend.FenceLost:
                break
            with lock:
                if b'"B"' in objects[key][0]:
                    both.append(round(time.monotonic() - t0, 2))
            time.sleep(0.05)
        assert not both, f"A's check_fence passed while B held the lease, at {both} s"
    finally:
        lease = backend._leases.pop(storage.describe("driver.lock"), None)
        if lease is not None:
            lease._stop.set()
