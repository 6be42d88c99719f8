import json

import pytest

from regional.decision import EpochKind, RegionRecord, RegionState
from regional.errors import RegionalConfigError, RegionalStoreError
from regional.store import EpochRecord, FallBack, Intent, Slice, Store, local_path


def record(epoch, regions, kind=EpochKind.GLOBAL, fallen=None):
    return EpochRecord(epoch, kind, {"a": Slice(0, 5, 5)}, fallen or {}, regions)


def test_records_round_trip_and_the_newest_is_the_state(tmp_path):
    store = Store(tmp_path)
    store.write_record(record(0, {"a": RegionRecord(5, 0)}))
    fallen = {"b": FallBack(0, "boom")}
    r1 = record(1, {"a": RegionRecord(9, 1), "b": RegionRecord(0, 0, 1, RegionState.FALLEN_BACK, "boom")},
                EpochKind.REGIONAL, fallen)
    store.write_record(r1)
    assert store.epochs() == [0, 1]
    assert store.read_record(1) == r1
    assert store.region_states()["a"].committed_offset == 9
    assert store.region_states(before=1)["a"].committed_offset == 5
    assert store.latest_record(before=0) is None


def test_a_torn_temporary_file_is_ignored(tmp_path):
    store = Store(tmp_path)
    store.write_record(record(0, {"a": RegionRecord(5, 0)}))
    (store.root / "epochs" / ".000000000001.json.abc.tmp").write_text('{"epoch": 1, "ki')
    assert store.epochs() == [0]
    assert store.latest_record().epoch == 0


def test_a_corrupt_record_is_refused_with_a_clear_error(tmp_path):
    store = Store(tmp_path)
    store.write_record(record(0, {"a": RegionRecord(5, 0)}))
    (store.root / "epochs" / "000000000001.json").write_text('{"epoch": 1, "ki')
    with pytest.raises(RegionalStoreError, match=r"000000000001\.json is corrupt.*new checkpointLocation"):
        store.latest_record()
    (store.root / "epochs" / "000000000001.json").write_text(json.dumps({"version": 1, "epoch": 1}))
    with pytest.raises(RegionalStoreError, match="corrupt"):
        store.latest_record()


def test_intents_round_trip_with_their_handles(tmp_path):
    store = Store(tmp_path)
    intent = Intent(record(3, {"a": RegionRecord(5, 3)}), {"a": {"file": "x.parquet"}}, {"b": ("y", 2)})
    store.write_intent(3, intent)
    assert store.read_intent(3) == intent
    assert store.read_intent(4) is None


def test_prune_keeps_the_newest_and_every_referenced_epoch(tmp_path):
    store = Store(tmp_path)
    for e in range(10):
        # region b fell back at epoch 2 and still references it
        b = RegionRecord(3, 2, e - 2, RegionState.FALLEN_BACK) if e > 2 else RegionRecord(3, e)
        store.write_record(record(e, {"a": RegionRecord(e, e), "b": b}))
        store.write_intent(e, Intent(record(e, {}), {}))
    store.prune(retain_epochs=3)
    assert store.epochs() == [2, 7, 8, 9]
    assert not list((store.root / "intents").iterdir())


def test_only_local_checkpoints(tmp_path):
    assert local_path(f"file://{tmp_path}") == tmp_path
    assert local_path(f"file:{tmp_path}") == tmp_path
    with pytest.raises(RegionalConfigError, match="local"):
        local_path("s3://bucket/ck")


def test_a_stop_request_counts_only_for_the_run_that_made_it(tmp_path):
    import time

    store = Store(tmp_path)
    store.request_final_epoch(after_epoch=3)
    assert store.final_epoch_requested_since(time.time() - 60)
    assert not store.final_epoch_requested_since(time.time() + 1)  # a later run: stale, ignored
    store.clear_final_epoch_request()
    assert not store.final_epoch_requested_since(0)
