"""The Delta target against a real Delta table on disk (deltalake; no Spark needed)."""

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from regional.errors import RegionalConfigError, RegionalStoreError
from regional.targets import EpochReport, load_target
from regional.targets.delta import STAGING_DIR, DeltaTarget
from support import QUERY


def batches(region, start, n):
    yield pa.record_batch({"value": [f"{region}-{i}" for i in range(start, start + n)]})


def target(tmp_path, query=QUERY):
    return load_target({"target": "delta", "path": str(tmp_path / "t"), "queryid": query})


def test_one_transaction_per_epoch_and_never_twice(tmp_path):
    t = target(tmp_path)
    handles = {r: t.prepare(5, r, batches(r, 0, 3)) for r in ("a", "b")}
    report = EpochReport(5, "regional", {"a": (0, 3), "b": (0, 3)},
                         {"c": (4, "quarantined after 2 failed attempt(s): ValueError: bad record 'secret-c-7'")},
                         {"a": 3, "b": 3})
    assert not t.published(5)
    t.commit(5, handles, report)
    table = DeltaTable(str(tmp_path / "t"))
    assert table.transaction_version(f"regional-{QUERY}") == 5 and t.published(5)
    versions = table.version()
    t.commit(5, handles, report)  # a re-run after a crash: the files have moved already
    t.commit(4, {"a": t.prepare(4, "a", batches("a", 9, 1))}, None)  # an older epoch: already covered
    table = DeltaTable(str(tmp_path / "t"))
    assert table.version() == versions
    assert sorted(table.to_pyarrow_table().column("value").to_pylist()) == ["a-0", "a-1", "a-2",
                                                                            "b-0", "b-1", "b-2"]
    meta = [h["regional"] for h in table.history() if "regional" in h]
    assert meta == [{"epoch": 5, "query_id": QUERY, "kind": "regional",
                     "committed": {"a": {"start": 0, "end": 3, "rows": 3}, "b": {"start": 0, "end": 3, "rows": 3}},
                     "fallen_back": {"c": {"ref_epoch": 4, "reason": "quarantined: ValueError"}}}]
    assert "secret" not in str(table.history())  # the record the message quotes stays out of the table's history


def test_a_new_query_on_the_same_table_is_not_skipped(tmp_path):
    old = target(tmp_path)
    old.commit(7, {"a": old.prepare(7, "a", batches("old", 0, 2))})
    new = target(tmp_path, "22222222-2222-4222-8222-222222222222")  # a wiped checkpoint: a new query id
    assert not new.published(0)
    new.commit(0, {"a": new.prepare(0, "a", batches("new", 0, 2))})
    values = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().column("value").to_pylist()
    assert sorted(values) == ["new-0", "new-1", "old-0", "old-1"]


def test_files_go_straight_into_the_table_and_abort_removes_only_what_is_not_published(tmp_path):
    t = target(tmp_path)
    handle = t.prepare(0, "a/../b", batches("x", 0, 2))
    written = tmp_path / "t" / handle["files"][0]["name"]
    assert written.exists() and "/" not in handle["files"][0]["name"]  # the region id is not a path
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [written.name]  # nothing beside it, no temporary
    t.abort(0, {"a/../b": handle})
    assert not written.exists()
    assert t.prepare(0, "a", iter([])) is None
    published = t.prepare(1, "a", batches("a", 0, 2))
    t.commit(1, {"a": published})
    t.abort(1, {"a": published})  # Spark aborts a batch whose commit failed after the table took it
    assert sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table().column("value").to_pylist()) == ["a-0", "a-1"]


def test_sweep_never_deletes_a_file_the_table_held_once(tmp_path):
    """A file that OPTIMIZE (or DELETE, an overwrite) removed is still read by time travel and lagging readers:
    only Delta's VACUUM may delete it. Files of task attempts that died are left to VACUUM too."""
    t = target(tmp_path)
    for epoch in (1, 2):
        t.commit(epoch, {"a": t.prepare(epoch, "a", batches(f"e{epoch}", 0, 2))})
    orphan = t.prepare(2, "a", batches("dead", 0, 1))  # an attempt that died: never in any commit
    table = DeltaTable(str(tmp_path / "t"))
    version = table.version()
    table.optimize.compact()
    t.sweep(2)
    old = DeltaTable(str(tmp_path / "t"), version=version).to_pyarrow_table().column("value").to_pylist()
    assert sorted(old) == ["e1-0", "e1-1", "e2-0", "e2-1"]
    assert (tmp_path / "t" / orphan["files"][0]["name"]).exists()


def test_an_older_regionals_staged_epoch_is_moved_in_and_its_leftovers_swept(tmp_path):
    """A checkpoint whose intent was decided by a regional that staged files aside: finishing it after the
    upgrade moves them into the table; staged files of recorded epochs are swept."""
    t = target(tmp_path)
    handle = t.prepare(0, "a", batches("a", 0, 2))
    name = handle["files"][0]["name"]
    staging = tmp_path / "t" / STAGING_DIR / QUERY
    (staging / "e0").mkdir(parents=True)
    (tmp_path / "t" / name).rename(staging / "e0" / name)
    old = {k: v for k, v in handle.items() if k != "in_table"}
    (staging / "e1").mkdir()
    (staging / "e1" / "left.parquet").write_bytes(b"x")
    t.commit(0, {"a": old})
    assert sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table().column("value").to_pylist()) == ["a-0", "a-1"]
    t.sweep(1)
    assert not list(staging.rglob("*.parquet"))


def test_a_written_file_gone_before_publishing_is_an_error(tmp_path):
    t = target(tmp_path)
    handle = t.prepare(0, "a", batches("a", 0, 1))
    name = handle["files"][0]["name"]
    (tmp_path / "t" / name).unlink()
    with pytest.raises(RegionalStoreError, match="gone before it was published"):
        t.commit(0, {"a": handle})


def test_a_failing_slice_leaves_no_partial_file(tmp_path):
    t = target(tmp_path)

    def broken():
        yield pa.record_batch({"value": ["x"]})
        raise ValueError("upstream broke")

    with pytest.raises(ValueError):
        t.prepare(0, "a", broken())
    assert not list((tmp_path / "t").rglob("*.parquet"))


def test_needs_a_path_and_a_known_name():
    with pytest.raises(RegionalConfigError, match="option\\('path'"):
        DeltaTarget({"queryid": QUERY})
    with pytest.raises(RegionalConfigError, match="unknown target 'base'"):
        load_target({"target": "base"})
    with pytest.raises(RegionalConfigError, match=r"unknown target '\.\./x'"):
        load_target({"target": "../x"})


# -- the table's schema ------------------------------------------------------------------------------------------


def fields(**types):
    return pa.schema([pa.field(n, t) for n, t in types.items()])


def test_compare_schemas_names_every_column_that_does_not_fit():
    from regional.targets.delta import compare_schemas

    table = pa.schema([pa.field("value", pa.string()), pa.field("n", pa.int64(), nullable=False),
                       pa.field("day", pa.string())])
    query = fields(Value=pa.string(), n=pa.int32(), extra=pa.float64(), day=pa.string())
    problems, new = compare_schemas(query, table, ["day"], merge=False)
    assert problems == ["column 'Value' is 'value' in the table (names differ in case only): rename it",
                        "column 'n' is long in the table, the query writes integer",
                        "column 'extra' (double) is not in the table"] and new == []
    problems, new = compare_schemas(fields(value=pa.large_string(), day=pa.string()), table, ["day"], merge=True)
    assert problems == ["column 'n' is NOT NULL in the table, and the query does not write it"] and new == []
    problems, new = compare_schemas(fields(value=pa.string(), extra=pa.int64(), n=pa.int64(), day=pa.string()),
                                    table, ["day"], merge=True)
    assert problems == [] and new == ["extra"]  # a nullable column into a NOT NULL one: its null rows are refused
    problems, _ = compare_schemas(fields(value=pa.string()), pa.schema([pa.field("value", pa.string()),
                                                                        pa.field("day", pa.string())]),
                                  ["day"], merge=True)
    assert problems == ["partition column 'day' is not written"]
    assert compare_schemas(fields(value=pa.string(), day=pa.string()), table.remove(1), ["day"], merge=False) \
        == ([], [])


def test_open_refuses_a_mismatch_before_anything_is_staged_and_merge_schema_adds_columns_in_one_commit(tmp_path):
    t = target(tmp_path)
    t.commit(0, {"a": t.prepare(0, "a", batches("a", 0, 2))})
    wider = pa.schema([("value", pa.string()), ("n", pa.int64())])
    with pytest.raises(RegionalConfigError, match=r"column 'n' \(long\) is not in the table.*mergeSchema"):
        t.open(wider)
    merging = load_target({"target": "delta", "path": str(tmp_path / "t"), "queryid": QUERY,
                           "mergeschema": "true"})
    merging.open(wider)
    handles = {"a": merging.prepare(1, "a", iter([pa.record_batch({"value": ["a-2"], "n": [7]})]))}
    merging.commit(1, handles)
    version = DeltaTable(str(tmp_path / "t")).version()
    merging.commit(1, handles)  # a re-run after a crash: nothing twice
    table = DeltaTable(str(tmp_path / "t"))
    assert table.version() == version and table.transaction_version(f"regional-{QUERY}") == 1
    log = (tmp_path / "t" / "_delta_log" / f"{version:020d}.json").read_text()  # the schema and the rows, one commit
    assert '"metaData"' in log and '"add"' in log and '"txn"' in log and '\\"name\\":\\"n\\"' in log
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["value"]) == [
        {"value": "a-0", "n": None}, {"value": "a-1", "n": None}, {"value": "a-2", "n": 7}]
    in_dir = sorted(p.name for p in (tmp_path / "t").glob("*.parquet"))
    assert in_dir == sorted(Path(u).name for u in table.file_uris())  # the epoch's own files: written again, removed


def test_a_partitioned_table_gets_one_file_per_partition_value_without_the_column(tmp_path):
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "t"), pa.table({"value": ["seed"], "day": ["d0"]}), partition_by=["day"])
    driver = target(tmp_path)
    driver.open(pa.schema([("value", pa.string()), ("day", pa.string())]))
    task = load_target({"target": "delta", "path": str(tmp_path / "t"), "queryid": QUERY,
                        **driver.task_options()})
    handle = task.prepare(0, "a", iter([pa.record_batch({"value": ["x", "y", "z"], "day": ["d1", None, "d1"]})]))
    assert sorted((str(f["partition"]["day"]), f["rows"]) for f in handle["files"]) == [("None", 1), ("d1", 2)]
    driver.commit(0, {"a": handle})
    table = DeltaTable(str(tmp_path / "t"))
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["value"]) == [
        {"value": "seed", "day": "d0"}, {"value": "x", "day": "d1"}, {"value": "y", "day": None},
        {"value": "z", "day": "d1"}]
    import pyarrow.parquet as pq
    for f in handle["files"]:
        assert pq.read_schema(tmp_path / "t" / f["name"]).names == ["value"]


def test_each_file_dictionary_encodes_only_the_columns_whose_values_repeat(tmp_path):
    """Ids, times and payloads are written plain, repeated values with a dictionary; every value reads back as
    written. A file with a nested column, or whose first rows are too few to tell, keeps pyarrow's default."""
    import pyarrow.parquet as pq

    n = 3000
    t = target(tmp_path)
    data = pa.record_batch({
        "id": pa.array(range(n), pa.int64()), "payload": [b"p%06d" % i for i in range(n)],
        "country": [["fr", "de", "it"][i % 3] for i in range(n)], "empty": pa.nulls(n, pa.string()),
        "mostly_one": [None if i % 2 else "x" for i in range(n)], "void": pa.nulls(n)})
    t.commit(1, {"a": t.prepare(1, "a", iter([data.slice(0, 1200), data.slice(1200)]))}, None)
    table = DeltaTable(str(tmp_path / "t"))
    assert table.to_pyarrow_table().sort_by("id").to_batches()[0].equals(data)
    (file,) = table.file_uris()
    meta = pq.ParquetFile(file).metadata
    dictionary = {meta.schema.column(i).name for i in range(meta.num_columns)
                  if any("DICTIONARY" in e for e in meta.row_group(0).column(i).encodings)}
    assert dictionary == {"country", "empty", "mostly_one", "void"}  # void: Spark's NullType, which Arrow cannot count

    nested = pa.record_batch({"id": pa.array(range(n), pa.int64()), "tags": [[i] for i in range(n)]})
    for name, slices in (("nested", [nested]), ("small-first", [data.slice(0, 999), data.slice(999)])):
        t2 = load_target({"target": "delta", "path": str(tmp_path / name), "queryid": QUERY})
        t2.commit(1, {"a": t2.prepare(1, "a", iter(slices))}, None)
        (file,) = DeltaTable(str(tmp_path / name)).file_uris()
        meta = pq.ParquetFile(file).metadata
        assert all(any("DICTIONARY" in e for e in meta.row_group(0).column(i).encodings)
                   for i in range(meta.num_columns)), name


def test_merge_schema_keeps_the_tables_not_null_columns_and_their_metadata(tmp_path):
    """Issue 59, item 1: delta-rs's merge mode made the NOT NULL column nullable (the rows' column is)."""
    from deltalake import Field, Schema
    from deltalake.schema import PrimitiveType

    DeltaTable.create(str(tmp_path / "t"), Schema([
        Field("a", PrimitiveType("integer"), nullable=False, metadata={"comment": "the key"}),
        Field("value", PrimitiveType("string"), nullable=True)]))
    wider = pa.schema([("a", pa.int32()), ("value", pa.string()), ("n", pa.int64())])
    driver = load_target({"target": "delta", "path": str(tmp_path / "t"), "queryid": QUERY, "mergeschema": "true"})
    driver.open(wider)
    task = load_target({"target": "delta", "path": str(tmp_path / "t"), "queryid": QUERY, "mergeschema": "true",
                        **driver.task_options()})
    rows = pa.record_batch({"a": pa.array([1], pa.int32()), "value": ["x"], "n": [7]}, schema=wider)
    driver.commit(0, {"a": task.prepare(0, "a", iter([rows]))})
    fields = {f.name: f for f in DeltaTable(str(tmp_path / "t")).schema().fields}
    assert (fields["a"].nullable, fields["a"].metadata) == (False, {"comment": "the key"})
    assert fields["n"].nullable and fields["value"].nullable


def test_hives_name_for_null_is_a_null_partition_value_as_delta_spark_logs_it(tmp_path):
    """Issue 59, item 2: '__HIVE_DEFAULT_PARTITION__' was logged as that string."""
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "t"), pa.table({"value": ["seed"], "day": ["d0"]}), partition_by=["day"])
    driver = target(tmp_path)
    driver.open(pa.schema([("value", pa.string()), ("day", pa.string())]))
    task = load_target({"target": "delta", "path": str(tmp_path / "t"), "queryid": QUERY, **driver.task_options()})
    handle = task.prepare(0, "a", iter([pa.record_batch({"value": ["x", "y"],
                                                         "day": ["__HIVE_DEFAULT_PARTITION__", "d1"]})]))
    assert sorted(str(f["partition"]["day"]) for f in handle["files"]) == ["None", "d1"]


def test_commit_info_carries_delta_sparks_streaming_metrics_and_isolation(tmp_path):
    """Issue 59, item 3: DESCRIBE HISTORY showed nulls for regional's commits."""
    t = target(tmp_path)
    handles = {r: t.prepare(3, r, batches(r, 0, 2)) for r in ("a", "b")}
    t.commit(3, handles)
    last = DeltaTable(str(tmp_path / "t")).history(1)[0]
    size = sum(f["size"] for h in handles.values() for f in h["files"])
    assert last["operationMetrics"] == {"numAddedFiles": "2", "numRemovedFiles": "0", "numFiles": "2",
                                        "numOutputRows": "4", "numOutputBytes": str(size)}
    assert (last["isBlindAppend"], last["isolationLevel"], last["readVersion"]) == (True, "Serializable",
                                                                                   last["version"] - 1)
    assert {k: last["operationParameters"][k] for k in ("outputMode", "queryId", "epochId")} == {
        "outputMode": "Append", "queryId": QUERY, "epochId": "3"}
