"""The store: versioned, checksummed files; every kind of damage is a clear error and publishes nothing."""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regional.coordinator import commit_epoch
from regional.errors import NEW_QUERY, RegionalConfigError, RegionalStoreError
from regional.protocol.plan import plan_epoch
from regional.protocol.settings import Settings
from regional.spark.reader import RegionalStreamReader
from regional.store import EpochKind, EpochRecord, FallBack, Intent, RegionState, Slice, Standing, Store
from support import MemoryTarget, read_store_file, tasks_for, write_store_file


def record(epoch, regions, kind=EpochKind.GLOBAL, committed=None, fallen=None):
    return EpochRecord(epoch, kind, committed or {}, fallen or {}, regions)


def test_records_round_trip_and_the_newest_is_the_state(tmp_path):
    store = Store(tmp_path)
    r0 = record(0, {"a": RegionState(5, 0), "b/../x": RegionState(3, 0)}, committed={"a": Slice(0, 5, 5)})
    r1 = record(1, {"a": RegionState(5, 0, 1, Standing.FALLEN_BACK, "down"), "b/../x": RegionState(9, 1)},
                EpochKind.REGIONAL, {"b/../x": Slice(3, 9, 6)}, {"a": FallBack(0, "down")})
    store.write_record(r0)
    store.write_record(r1)
    assert store.read_record(0) == r0 and store.latest_record() == r1 and store.latest_record(before=1) == r0
    assert sorted(p.name for p in (tmp_path / "regional" / "epochs").iterdir()) == [
        "000000000000.json", "000000000001.json"]  # region ids never become paths
    assert store.referenced_epochs() == [0]


def v1_record_json(r: EpochRecord) -> dict:
    """An epoch record as regional wrote it before format v2 (an object per region, a list per slice)."""
    def state(s: RegionState) -> dict:
        return {"committed_offset": s.committed_offset, "last_epoch": s.last_epoch,
                "consecutive_failures": s.consecutive_failures, "state": s.state.value, "reason": s.reason,
                "isolating": None if s.isolating is None else list(s.isolating), "dead_letters": s.dead_letters}
    return {"epoch": r.epoch, "kind": r.kind.value, "reason": r.reason, "regional_epochs": r.regional_epochs,
            "recorded_at": r.recorded_at,
            "committed": {k: [v.start, v.end, v.rows, v.cut] for k, v in r.committed.items()},
            "fallen_back": {k: [f.ref_epoch, f.reason, f.quarantined] for k, f in r.fallen_back.items()},
            "regions": {k: state(v) for k, v in r.regions.items()}, "lost": {}, "dead_lettered": {}}


def test_records_of_format_v1_still_read_after_an_upgrade(tmp_path):
    store = Store(tmp_path)
    # A region may be called "id" (the name of the v2 id column): the format says which layout a record has.
    old = record(3, {"id": RegionState(7, 2, 1, Standing.FALLEN_BACK, "down", (7, 9), 2), "b": RegionState(4, 3)},
                 EpochKind.REGIONAL, {"b": Slice(0, 4, 4, True)}, {"id": FallBack(2, "down")})
    body = json.dumps(v1_record_json(old), separators=(",", ":")).encode()
    path = tmp_path / "regional" / "epochs" / "000000000003.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(f"regional epoch v1 sha256={hashlib.sha256(body).hexdigest()}\n".encode() + body + b"\n")
    assert store.read_record(3) == old
    store.write_record(record(4, old.regions))
    assert (tmp_path / "regional" / "epochs" / "000000000004.json").read_bytes().startswith(b"regional epoch v2 ")


def test_region_columns_of_different_lengths_are_a_corrupt_record(tmp_path):
    store = Store(tmp_path)
    store.write_record(record(0, {"a": RegionState(5, 0), "b": RegionState(3, 0)}))
    path = tmp_path / "regional" / "epochs" / "000000000000.json"
    data = read_store_file(path, "epoch")
    data["regions"]["committed_offset"].pop()  # rewritten with a valid checksum: only the shape is wrong
    write_store_file(path, "epoch", data)
    with pytest.raises(RegionalStoreError, match=r"000000000000\.json is corrupt"):
        store.read_record(0)


states = st.builds(RegionState, st.integers(0, 2**62), st.none() | st.integers(-1, 10**6), st.integers(0, 99),
                   st.sampled_from(Standing), st.none() | st.text(max_size=20),
                   st.none() | st.tuples(st.integers(0, 99), st.integers(100, 199)), st.integers(0, 99),
                   timed_range=st.none() | st.integers(1, 10**6), failed_alone=st.integers(0, 9),
                   failed_alone_at=st.none() | st.floats(0, 2e9), alone_since=st.none() | st.integers(0, 10**6),
                   probe_passed=st.none() | st.integers(0, 10**6), alone_waits=st.integers(0, 9),
                   poison=st.lists(st.integers(0, 2**62), max_size=3).map(tuple),
                   first_seen_epoch=st.none() | st.integers(0, 10**6), first_seen_at=st.none() | st.floats(0, 2e9),
                   suspect_since_at=st.none() | st.floats(0, 2e9))
slices = st.builds(Slice, st.integers(0, 99), st.integers(100, 199), st.integers(0, 99), st.booleans())


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8), states, max_size=12),
       st.dictionaries(st.text(min_size=1, max_size=8), slices, max_size=12))
def test_every_region_state_and_slice_round_trips_through_the_store(tmp_path_factory, regions, committed):
    store = Store(tmp_path_factory.mktemp("ck"))
    r = record(0, regions, EpochKind.REGIONAL, committed)
    store.write_record(r)
    assert store.read_record(0) == r and list(store.read_record(0).regions) == list(regions)


def test_the_query_id_is_created_once_and_kept(tmp_path):
    store = Store(tmp_path)
    assert store.query_id() is None
    first = store.open_query()
    assert Store(tmp_path).open_query() == first and Store(tmp_path / "other").open_query() != first


def test_epochs_without_a_query_id_are_a_damaged_store_not_a_new_query(tmp_path):
    store = Store(tmp_path)
    store.open_query()
    store.write_record(record(0, {"a": RegionState(5, 0)}))
    (tmp_path / "regional" / "query.json").unlink()
    with pytest.raises(RegionalStoreError, match=r"no query\.json") as error:
        store.open_query()
    assert NEW_QUERY in str(error.value)  # never "a new checkpoint" alone: that publishes every record again


def test_a_torn_temporary_file_is_ignored(tmp_path):
    store = Store(tmp_path)
    store.write_record(record(0, {"a": RegionState(5, 0)}))
    (tmp_path / "regional" / "epochs" / ".000000000001.json.abc.tmp").write_text("regional epoch v1 sha")
    assert store.epochs() == [0]


def test_intents_round_trip_with_json_handles(tmp_path):
    store = Store(tmp_path)
    intent = Intent(record(3, {"a": RegionState(5, 3)}), {"a": {"name": "f.parquet", "rows": 5}}, {"b": None})
    store.write_intent(3, intent)
    assert store.read_intent(3) == intent
    assert b"pickle" not in (tmp_path / "regional" / "intents" / "000000000003.json").read_bytes()


def test_prune_keeps_the_newest_and_every_referenced_epoch(tmp_path):
    store = Store(tmp_path)
    for e in range(10):
        a = RegionState(e, 2, 1, Standing.FALLEN_BACK, "x") if e >= 3 else RegionState(e, e)
        store.write_record(record(e, {"a": a}))
        store.write_intent(e, Intent(record(e, {"a": a}), {}))
    store.prune(3)
    assert store.epochs() == [2, 7, 8, 9]
    assert list((tmp_path / "regional" / "intents").glob("*.json")) == []


def test_checkpoints_on_unsupported_schemes_are_refused_naming_the_option():
    with pytest.raises(RegionalConfigError, match=r"checkpointLocation='hdfs://nn/ck'.*not hdfs:"):
        Store("hdfs://nn/ck")
    with pytest.raises(RegionalConfigError, match="not a valid bucket name"):
        Store("s3a://B@d/ck")


def test_a_stop_request_counts_only_for_the_run_that_made_it(tmp_path):
    store = Store(tmp_path)
    started = time.time()
    store.request_final_epoch(3)
    assert store.final_epoch_requested_since(started)
    assert not store.final_epoch_requested_since(time.time() + 10)
    store.clear_final_epoch_request()
    assert not store.final_epoch_requested_since(0)


# -- damage, per store file kind ---------------------------------------------------------------


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])


def flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    newline = data.index(b"\n")
    data[newline + 1 + (len(data) - newline - 2) // 2] ^= 0x04  # inside the JSON, e.g. a digit of an offset
    path.write_bytes(bytes(data))


def future_version(path: Path) -> None:
    header, rest = path.read_bytes().split(b"\n", 1)
    path.write_bytes(re.sub(rb" v\d+ ", b" v9 ", header) + b"\n" + rest)


DAMAGE = {"truncated": (truncate, "corrupt"), "bit-flipped": (flip_bit, "checksum"),
          "future version": (future_version, "format v9")}


def a_running_store(tmp_path: Path) -> tuple[Store, MemoryTarget]:
    """Epoch 0 recorded, epoch 1 decided (intent written) but not published: a crash in phase two."""
    store, target = Store(tmp_path), MemoryTarget()
    store.open_query()
    store.record_write_options("run", {"regionAttempts": "3"})
    store.request_final_epoch(0)
    plan0 = plan_epoch(0, store.query_id(), str(tmp_path), {}, {"a": 5, "b": 5}, Settings())
    commit_epoch(plan0, tasks_for(plan0, failing={"b"}), store, target)
    plan1 = plan_epoch(1, store.query_id(), str(tmp_path), store.region_states(), {"a": 9, "b": 9}, Settings())
    target.fail_commit = True
    with pytest.raises(RuntimeError):
        commit_epoch(plan1, tasks_for(plan1), store, target)
    target.fail_commit = False
    return store, target


def rerun_epoch_1(store: Store, target: MemoryTarget) -> None:
    plan1 = plan_epoch(1, store.query_id() or "", str(store.checkpoint), store.region_states(before=1),
                       {"a": 9, "b": 9}, Settings())
    commit_epoch(plan1, tasks_for(plan1), store, target)


STORE_FILES = {
    "query": ("query.json", lambda s, t: s.open_query()),
    "epoch": ("epochs/000000000000.json", rerun_epoch_1),
    "intent": ("intents/000000000001.json", rerun_epoch_1),
    "write-options": ("write-options.json", lambda s, t: s.read_write_options()),
    "final-epoch-request": ("final-epoch-request.json", lambda s, t: s.final_epoch_requested_since(0)),
    "referenced-epochs": ("referenced-epochs", lambda s, t: s.referenced_epochs()),
}


@pytest.mark.parametrize("kind", sorted(STORE_FILES))
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_store_files_are_clear_errors_naming_the_file_and_publish_nothing(tmp_path, kind, damage):
    store, target = a_running_store(tmp_path)
    relative, use = STORE_FILES[kind]
    path = tmp_path / "regional" / relative
    assert path.exists()
    published_before = dict(target.commits)
    damage_it, message = DAMAGE[damage]
    damage_it(path)
    with pytest.raises(RegionalStoreError, match=message) as error:
        use(store, target)
    assert str(path) in str(error.value)
    assert target.commits == published_before
    # Its advice is safe to follow: a new checkpoint alone would publish every record into the target again.
    assert "new checkpointLocation" not in str(error.value) or NEW_QUERY in str(error.value)


def test_missing_store_files_never_read_as_done(tmp_path):
    # intent missing while the target already holds the epoch: an error, not a new decision
    store, target = a_running_store(tmp_path)
    target.commits[1] = {"a": "published"}
    (tmp_path / "regional" / "intents" / "000000000001.json").unlink()
    with pytest.raises(RegionalStoreError, match="neither its intent nor its record"):
        rerun_epoch_1(store, target)
    # the query id missing beside epoch records: damaged, not a new query
    (tmp_path / "regional" / "query.json").unlink()
    with pytest.raises(RegionalStoreError, match=r"no query\.json"):
        store.open_query()
    # the newest epoch record missing: Spark's offset log is ahead of the store
    store2, _ = a_running_store(tmp_path / "two")
    (tmp_path / "two" / "regional" / "epochs" / "000000000000.json").unlink()
    reader = RegionalStreamReader({}, {"source": "generator", "regions": "2", "checkpointlocation": str(
        tmp_path / "two")})
    with pytest.raises(RegionalStoreError, match="Spark committed epoch 0 but the regional store"):
        reader.latestOffset({"query_id": store2.query_id(), "epoch": 0}, None)  # type: ignore[arg-type]
    # writeStream's settings never recorded: the source refuses to plan
    store3 = Store(tmp_path / "three")
    store3.open_query()
    reader = RegionalStreamReader({}, {"source": "generator", "checkpointlocation": str(tmp_path / "three")})
    with pytest.raises(RegionalConfigError, match=r"call regional\.register"):
        reader.resolved_settings()


def test_a_file_of_another_kind_is_refused(tmp_path):
    path = tmp_path / "x.json"
    write_store_file(path, "intent", {"a": 1})
    with pytest.raises(RegionalStoreError, match="'intent' file where a 'epoch' file belongs"):
        read_store_file(path, "epoch")
