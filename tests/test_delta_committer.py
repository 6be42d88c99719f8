"""The Delta committer against a real Delta table on disk (deltalake; no Spark needed)."""

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from regional.committers import DeltaCommitter, EpochReport
from regional.errors import RegionalConfigError


def batches(region, start, n):
    yield pa.record_batch({"value": [f"{region}-{i}" for i in range(start, start + n)]})


def committer(tmp_path):
    return DeltaCommitter({"path": str(tmp_path / "t"), "checkpointlocation": str(tmp_path / "ck")})


def test_one_transaction_per_epoch_and_never_twice(tmp_path):
    c = committer(tmp_path)
    handles = {r: c.prepare(5, r, batches(r, 0, 3)) for r in ("a", "b")}
    report = EpochReport(5, "regional", {"a": (0, 3), "b": (0, 3)}, {"c": (4, "down")}, {"a": 3, "b": 3})
    c.commit(5, handles, report)
    table = DeltaTable(str(tmp_path / "t"))
    assert table.transaction_version(c.app_id) == 5
    versions = table.version()
    c.commit(5, handles, report)  # a re-run after a crash
    c.commit(4, {"a": c.prepare(4, "a", batches("a", 9, 1))}, None)  # an older epoch: already covered
    table = DeltaTable(str(tmp_path / "t"))
    assert table.version() == versions
    assert sorted(table.to_pyarrow_table().column("value").to_pylist()) == ["a-0", "a-1", "a-2",
                                                                            "b-0", "b-1", "b-2"]
    meta = [h["regional"] for h in table.history() if "regional" in h]
    assert meta == [{"epoch": 5, "kind": "regional",
                     "committed": {"a": {"start": 0, "end": 3, "rows": 3}, "b": {"start": 0, "end": 3, "rows": 3}},
                     "fallen_back": {"c": {"ref_epoch": 4, "reason": "down"}}}]


def test_abort_removes_staged_files_and_empty_slices_stage_nothing(tmp_path):
    c = committer(tmp_path)
    handle = c.prepare(0, "a/../b", batches("x", 0, 2))
    staged = tmp_path / "t" / handle.path
    assert staged.exists() and staged.parent == tmp_path / "t"  # the region id is not a path
    c.abort(0, {"a/../b": handle})
    assert not staged.exists()
    assert c.prepare(0, "a", iter([])) is None


def test_a_failing_slice_leaves_no_partial_file(tmp_path):
    c = committer(tmp_path)

    def broken():
        yield pa.record_batch({"value": ["x"]})
        raise ValueError("upstream broke")

    with pytest.raises(ValueError):
        c.prepare(0, "a", broken())
    assert not list((tmp_path / "t").glob("*.parquet"))


def test_needs_a_path():
    with pytest.raises(RegionalConfigError, match="option\\('path'"):
        DeltaCommitter({})
