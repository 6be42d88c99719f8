"""regional's storage layer and store on a real S3 API server (s3proxy), beside the local one; a query whose
checkpoint is on S3 killed with SIGKILL and restarted."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

import pytest

import regional
from integration.helpers import (
    ROOT,
    add_epoch_of_files,
    assert_exactly_once_in_order,
    expected_rows,
    failure_summary,
    run_killable,
)
from regional.errors import RegionalStoreError
from regional.location import parse_location
from regional.storage import FenceLost, Storage, open_storage
from regional.storage import object_store as object_store_backend
from regional.store import Store
from regional.store.model import EpochKind, EpochRecord, Intent
from regional.store.store import _FENCE
from regional.testing.s3_server import SECRET_KEY, upload_input


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path) -> Storage:
    if request.param == "local":
        return open_storage(parse_location("test", str(tmp_path / "root")))
    s3 = request.getfixturevalue("s3")
    bucket = f"contract-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(bucket)
    return open_storage(parse_location("test", f"s3a://{bucket}/some/root"))


def test_the_storage_contract(storage: Storage):
    assert storage.read("absent") is None  # missing is None, never empty bytes
    storage.write("a/one", b"1")
    storage.write("a/one", b"one")  # replaced whole
    storage.write("a/b/two", b"2")
    storage.write("top", b"t")
    assert storage.read("a/one") == b"one"
    assert sorted(i.name for i in storage.list("a")) == ["a/one"]
    assert sorted(i.name for i in storage.list("a", recursive=True)) == ["a/b/two", "a/one"]
    assert sorted(i.name for i in storage.list("", recursive=True)) == ["a/b/two", "a/one", "top"]
    assert [i.size for i in storage.list("a")] == [3]
    assert storage.list("nothing-here") == []
    assert storage.child("a").read("b/two") == b"2"
    heads = storage.heads(["top", "a/one", "absent", "a/absent"])  # one by one, or at once: the same answers
    assert {n: i and (i.name, i.size) for n, i in heads.items()} == {
        "top": ("top", 1), "a/one": ("a/one", 3), "absent": None, "a/absent": None}

    # create: of many concurrent creators, exactly one wins, and the object holds its bytes
    results: dict[int, bool] = {}

    def create(i: int) -> None:
        results[i] = storage.create("once", str(i).encode())

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in results.items() if won]
    assert len(winners) == 1 and storage.read("once") == str(winners[0]).encode()
    assert storage.create("once", b"other") is False

    # a writer: the object exists whole once closed, and not at all if discarded
    writer = storage.open_writer("written")
    writer.write(b"x" * 100_000)
    assert storage.read("written") is None
    writer.close()
    assert storage.read("written") == b"x" * 100_000
    streamed = storage.read_stream("written")
    assert streamed is not None and streamed[0].size == 100_000 and b"".join(streamed[1]) == b"x" * 100_000
    assert storage.read_stream("absent") is None
    dropped = storage.open_writer("dropped")
    dropped.write(b"y" * 10)
    storage.discard(dropped)
    del dropped
    assert storage.read("dropped") is None

    storage.delete("top")
    storage.delete("top")  # deleting what is gone is nothing
    storage.delete_tree("a")
    assert sorted(i.name for i in storage.list("", recursive=True)) == ["once", "written"]


@pytest.mark.parametrize("fault", ["drop", "503"])
def test_store_calls_ride_out_dropped_connections_and_503s(s3, monkeypatch, fault):
    """Behind a proxy that drops every connection (or answers 503) for 1.5 s: a create (a conditional PUT), a
    write, a read, a list, a delete and the lease each succeed once the faults stop, rather than fail the query
    (object_store alone gives up at once on a conditional PUT or a dropped connection)."""
    import json

    from regional.storage.config import STORAGE_CONF_ENV
    from regional.testing.faulty_proxy import FaultyProxy
    from regional.testing.s3_server import hadoop_conf

    bucket = s3.create_bucket(f"retries-{uuid.uuid4().hex[:12]}")
    proxy = FaultyProxy(("127.0.0.1", s3.port))
    monkeypatch.setenv(STORAGE_CONF_ENV, json.dumps(hadoop_conf(proxy.endpoint)))
    storage = open_storage(parse_location("test", f"{bucket}/root"))
    calls = {
        "create": lambda: storage.create("created", b"c"),
        "write": lambda: storage.write("written", b"w"),
        "read": lambda: storage.read("written"),
        "list": lambda: sorted(i.name for i in storage.list("", recursive=True)),
        "delete": lambda: storage.delete("created"),
        "fence": lambda: storage.try_fence("lease", {"token": "t1"}),
    }
    expected = {"create": True, "write": None, "read": b"w", "list": ["created", "written"],
                "delete": None, "fence": None}
    try:
        for name, call in calls.items():
            proxy.set_mode(fault)
            healed = threading.Timer(1.5, proxy.set_mode, args=("pass",))
            healed.start()
            assert call() == expected[name], name
            healed.join()
        assert storage.fence_holder("lease") is not None
    finally:
        storage.release_fence("lease")
        proxy.stop()
    assert proxy.faults > 0


def s3_store(s3, name: str = "ck") -> Store:
    bucket = f"store-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(bucket)
    return Store(f"s3a://{bucket}/{name}")


def test_a_store_on_s3_refuses_a_second_decision_and_names_a_torn_object(s3):
    store = s3_store(s3)
    query_id = store.open_query()
    assert Store(str(store.checkpoint)).open_query() == query_id  # one query id, whoever opens it
    store.write_intent(0, Intent(EpochRecord(0, EpochKind.GLOBAL, {}, {}, {}, recorded_at=1.0), {}))
    with pytest.raises(RegionalStoreError, match="decided by another driver"):
        Store(str(store.checkpoint)).write_intent(0, Intent(EpochRecord(0, EpochKind.GLOBAL, {}, {}, {},
                                                                         recorded_at=2.0), {}))
    store.storage.write("query.json", b"regional query v1 sha256=00\n{\"query_id\": \"x\"}")
    with pytest.raises(RegionalStoreError, match=r"s3a://store-[0-9a-f]+/ck/regional/query.json is corrupt"):
        Store(str(store.checkpoint)).query_id()


LEASE_CHILD = """
import sys, time
from regional.store import Store
from regional.store.model import EpochKind, EpochRecord, Intent
Store(sys.argv[1]).fence()
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_driver_is_fenced_on_s3_until_the_first_ones_lease_expires(s3, monkeypatch):
    monkeypatch.setattr(object_store_backend, "LEASE_TTL_S", 3.0)
    store = s3_store(s3)
    store.open_query()
    env = {**__import__("os").environ, "REGIONAL_LEASE_TTL_S": "3"}
    child = subprocess.Popen([sys.executable, "-c", LEASE_CHILD, str(store.checkpoint)], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        # The first driver lives and renews its lease: a second one is refused, however long it waits.
        with pytest.raises(RegionalStoreError, match="another driver is running the query"):
            Store(str(store.checkpoint)).fence(wait_s=6)
        child.kill()  # SIGKILL: the lease is never released, only left unrenewed
        child.wait()
        started = time.monotonic()
        second = Store(str(store.checkpoint))
        second.fence(wait_s=0)
        waited = time.monotonic() - started
        assert waited >= 3.0  # not before the lease went unrenewed for a whole TTL
        holder = second.storage.fence_holder(_FENCE)
        assert holder is not None and holder["token"] == second.fence_token
        second.fence()  # still held: no error
        second.release_fence()
        assert second.storage.fence_holder(_FENCE) is None  # a clean end lets the next start at once
        third = Store(str(store.checkpoint))
        started = time.monotonic()
        third.fence(wait_s=0)
        assert time.monotonic() - started < 3.0 and third.storage.fence_holder(_FENCE)["token"] == third.fence_token
        third.release_fence()
    finally:
        if child.poll() is None:
            child.kill()


def test_a_driver_whose_lease_was_taken_over_stops(s3, monkeypatch):
    monkeypatch.setattr(object_store_backend, "LEASE_TTL_S", 1.5)
    store = s3_store(s3)
    store.open_query()
    store.fence()
    # Another driver takes the lease over (as after a pause longer than the TTL, a GC or a network partition).
    store.storage.write(_FENCE, b'{"token": "someone else"}')
    time.sleep(1.5)  # a renewal or two
    with pytest.raises(FenceLost, match="lost"):
        store.fence()


# The campaign's (REGIONAL_CAMPAIGN=1): CI keeps within its time with the test below, which kills the same way with
# everything on S3.
@pytest.mark.campaign
def test_a_query_with_its_checkpoint_on_s3_survives_sigkill_exactly_once(s3, tmp_path, monkeypatch):
    """Files in, Delta out (local), the store and Spark's offset log on s3a:// through the JVM shim; the driver is
    killed inside phase two, after the decision, and the restart finishes the epoch as decided."""
    bucket = f"query-{uuid.uuid4().hex[:12]}"
    ck = s3.create_bucket(bucket) + "/ck"
    inp, out, marker, b_down = tmp_path / "in", tmp_path / "out", tmp_path / "reached", tmp_path / "b_down"
    inputs = add_epoch_of_files(inp, ["a", "b", "c"], "001", 10)
    monkeypatch.setenv("REGIONAL_LEASE_TTL_S", "5")  # the killed driver's lease holds up the restart this long

    def run(failpoint: str | None) -> str:
        return run_killable(["integration.s3_child", str(inp), str(out), ck, s3.endpoint, str(b_down)],
                            failpoint, marker, timeout=300)

    b_down.touch()
    assert run("before_publish:1") == "killed"
    store = Store(ck)
    assert [e for e in store.epochs()] == [0] and store.read_intent(1) is not None
    b_down.unlink()
    assert run(None) == "finished"
    epochs = regional.status(ck).epochs
    assert epochs[1].kind == "regional" and set(epochs[1].fallen_back) == {"b"}
    assert_exactly_once_in_order(out, expected_rows(inputs))
    # Spark's own checkpoint is on S3 too, beside regional's store
    names = {i.name for i in open_storage(parse_location("ck", ck)).list("", recursive=True)}
    assert any(n.startswith("offsets/") for n in names) and any(n.startswith("regional/epochs/") for n in names)
    # the keys given to Spark reached regional's reads and writes, and none of its files
    for info in open_storage(parse_location("ck", ck)).list("", recursive=True):
        data = open_storage(parse_location("ck", ck)).read(info.name) or b""
        assert SECRET_KEY.encode() not in data, info.name


def test_everything_on_s3_a_failing_region_a_poison_record_and_a_sigkill(s3, tmp_path, monkeypatch):
    """The input files, the store, Spark's offset log, the Delta table and the dead-letter table on S3: region b's
    target is down, one record is poison, and the driver is killed in phase two. After the restart every record
    is in the table exactly once, the poison one in the dead letters, read back with deltalake and with
    delta-spark over s3a://, and no file is left that the tables do not hold. The poison record's ValueError is
    named by deadLetterOn (integration/s3_child.py): it is dead-lettered on its first failure alone, the evidence
    rule's epochs and waits being test_dead_letters' to test, not S3's."""
    from deltalake import DeltaTable

    from regional.storage.config import object_store_options
    from regional.testing.exactly_once import delta_landed

    bucket = s3.create_bucket(f"all-{uuid.uuid4().hex[:12]}")
    ck, out, dlq, inp = f"{bucket}/ck", f"{bucket}/tables/out", f"{bucket}/tables/dead-letters", f"{bucket}/in"
    marker, b_down = tmp_path / "reached", tmp_path / "b_down"
    inputs = add_epoch_of_files(tmp_path / "in", ["a", "b", "c"], "001", 10)
    upload_input(tmp_path / "in", inp)
    poison = ("c", 6)
    monkeypatch.setenv("REGIONAL_LEASE_TTL_S", "5")
    args = ["integration.s3_child", inp, out, ck, s3.endpoint, str(b_down), dlq, inputs["c"][6]]

    b_down.touch()
    assert run_killable(args, "before_publish:1", marker, timeout=300) == "killed"
    b_down.unlink()
    child = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]

    expected = {r: [(o, v.upper()) for o, v in enumerate(values) if (r, o) != poison] for r, values in inputs.items()}
    from regional.testing.exactly_once import check

    check(expected, delta_landed(out)).assert_ok()
    options = object_store_options(parse_location("out", out))
    rows = DeltaTable(out, storage_options={**options, "conditional_put": "etag"}).to_pyarrow_table().to_pylist()
    assert sorted((r["region"], r["offset"], r["value"]) for r in rows) == sorted(
        (r, o, v) for r, values in expected.items() for o, v in values)
    assert f"delta-spark rows: {len(rows)}" in child.stdout
    letters = DeltaTable(dlq, storage_options=options).to_pyarrow_table().to_pylist()
    assert [(r["region"], r["offset"], r["value"], r["error"]) for r in letters] == [
        ("c", 6, inputs["c"][6], f"ValueError: poison record {inputs['c'][6]}")]
    for table in (out, dlq):  # nothing written that the table does not hold, no staging directory
        storage = open_storage(parse_location("table", table))
        held = {u.rsplit("/", 1)[-1] for u in DeltaTable(table, storage_options=options).file_uris()}
        written = {i.name for i in storage.list("", recursive=True) if not i.name.startswith("_delta_log/")}
        assert written == held, table
    checkpoint = {i.name for i in open_storage(parse_location("ck", ck)).list("", recursive=True)}
    assert any(n.startswith("offsets/") for n in checkpoint) and "regional/query.json" in checkpoint  # both on S3
    assert any(n.startswith("regional/sources/files/") for n in checkpoint)  # the manifest of the S3 input
    bucket_storage = open_storage(parse_location("bucket", bucket))
    for info in bucket_storage.list("", recursive=True):  # the keys reached no file, no commit
        assert SECRET_KEY.encode() not in (bucket_storage.read(info.name) or b""), info.name


@pytest.mark.campaign  # 143 s idle, keeping CI within its time (it keeps the stores' 503s and a query on S3 killed)
def test_503s_dropped_connections_and_a_restarted_s3_lose_and_double_nothing(s3, tmp_path, monkeypatch):
    """Everything on S3 behind a proxy that answers 503 (Slow Down) and drops connections, on and off, and the S3
    server restarted once (down 3 s), while the query runs (regional's store, Spark's s3a offset log, delta-rs's
    commits and the tasks' uploads all go through it). The query may ride the faults out on retries, or stop
    with an error and be started again, as a user would: either way every record lands once and the poison one
    only in the dead letters."""
    from deltalake import DeltaTable

    from regional.storage.config import object_store_options
    from regional.testing.exactly_once import check, delta_landed
    from regional.testing.faulty_proxy import FaultyProxy

    bucket = s3.create_bucket(f"faults-{uuid.uuid4().hex[:12]}")
    ck, out, dlq = f"{bucket}/ck", f"{bucket}/out", f"{bucket}/dead-letters"
    inp, b_down = tmp_path / "in", tmp_path / "b_down"
    inputs = add_epoch_of_files(inp, ["a", "b", "c"], "001", 24)
    poison = ("a", 13)
    proxy = FaultyProxy(("127.0.0.1", s3.port))
    monkeypatch.setenv("REGIONAL_LEASE_TTL_S", "5")
    stop = threading.Event()

    restarts = []

    def chaos() -> None:
        while not stop.wait(2.0):
            if not restarts:  # once: the S3 server itself goes down for 3 s and comes back
                s3.restart(down_s=3.0)
                restarts.append(time.monotonic())
                continue
            for mode in ("503", "pass", "drop"):
                proxy.set_mode(mode)
                if stop.wait(0.6 if mode != "pass" else 2.0):
                    break
            proxy.set_mode("pass")

    args = [sys.executable, "-m", "integration.s3_child", str(inp), out, ck, proxy.endpoint, str(b_down), dlq,
            inputs["a"][13]]
    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    runs: list[str] = []
    try:
        for _ in range(6):
            child = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
            runs.append("finished" if child.returncode == 0 else failure_summary(child.stdout + child.stderr))
            if child.returncode == 0:
                break
    finally:
        stop.set()
        thread.join()
        proxy.stop()
    for number, outcome in enumerate(runs, 1):  # shown by pytest if the test fails
        print(f"run {number}: {outcome}")
    assert runs[-1] == "finished", runs
    assert proxy.faults > 0 and restarts
    print(f"runs: {len(runs)}; connections faulted: {proxy.faults}")

    expected = {r: [(o, v.upper()) for o, v in enumerate(values) if (r, o) != poison] for r, values in inputs.items()}
    check(expected, delta_landed(out)).assert_ok()
    options = object_store_options(parse_location("dlq", dlq))
    letters = DeltaTable(dlq, storage_options=options).to_pyarrow_table().to_pylist()
    assert [(r["region"], r["offset"], r["value"]) for r in letters] == [("a", 13, inputs["a"][13])]
