"""The Delta target honours the table's protocol or refuses it (issue 46), without Spark: tables are made as the
Delta protocol has them (a first commit with protocol and metaData, as delta-spark writes it), and what regional
writes is read back with deltalake and, for the files, with pyarrow. The differential tests against delta-spark
are in integration/test_delta_protocol.py."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from regional.errors import RegionalConfigError
from regional.targets import load_target
from regional.targets.base import RowsInvalid
from regional.targets.delta import OPTIONS, sql
from regional.targets.delta.features import REFUSED, SUPPORTED
from support import QUERY


def field(name, kind="string", nullable=True, **metadata):
    return {"name": name, "type": kind, "nullable": nullable, "metadata": metadata}


def make_table(path: Path, fields, configuration=None, writer=7, reader=1, features=(), reader_features=None,
               partition_columns=()):
    """A Delta table's first commit, as the protocol has it (what delta-spark's CREATE TABLE writes)."""
    (path / "_delta_log").mkdir(parents=True)
    protocol = {"minReaderVersion": reader, "minWriterVersion": writer}
    if writer >= 7:
        protocol["writerFeatures"] = list(features)
    if reader >= 3:
        protocol["readerFeatures"] = list(reader_features or [])
    meta = {"id": "5b3d6a52-0000-4000-8000-000000000000", "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps({"type": "struct", "fields": fields}),
            "partitionColumns": list(partition_columns), "configuration": configuration or {},
            "createdTime": 1}
    lines = [{"commitInfo": {"timestamp": 1, "operation": "CREATE TABLE"}}, {"metaData": meta},
             {"protocol": protocol}]
    (path / "_delta_log" / f"{0:020d}.json").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def driver_and_task(path: Path, schema: pa.Schema, **options):
    driver = load_target({"target": "delta", "path": str(path), "queryid": QUERY, **options})
    driver.open(schema)
    task = load_target({"target": "delta", "path": str(path), "queryid": QUERY, **options, **driver.task_options()})
    return driver, task


def rows_of(path: Path) -> list[dict]:
    """The table's rows as deltalake's DataFusion reader has them (its ``to_pyarrow_table`` ignores column
    mapping: it reads delta-spark's own files of a mapped table as nulls too)."""
    from deltalake import QueryBuilder

    reader = QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT * FROM t")
    return sorted(pa.RecordBatchReader.from_stream(reader).read_all().to_pylist(),
                  key=lambda r: json.dumps(r, default=str))


KV = pa.schema([("k", pa.string()), ("v", pa.int64())])


def batch(k, v):
    return pa.record_batch({"k": pa.array(k, pa.string()), "v": pa.array(v, pa.int64())})


# -- refused features ------------------------------------------------------------------------------------------

# Reader-writer features are listed in both lists (deltalake refuses to open a table otherwise).
READER_WRITER = {"typeWidening", "typeWidening-preview", "v2Checkpoint", "vacuumProtocolCheck", "variantType",
                 "variantType-preview", "variantShredding-preview", "columnMapping", "deletionVectors",
                 "timestampNtz", "collations-preview"}


@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_a_refused_feature_is_named_at_open_and_nothing_is_staged(tmp_path, feature):
    both = feature in READER_WRITER
    path = make_table(tmp_path / "t", [field("k"), field("v", "long")], features=[feature, "appendOnly"],
                      reader=3 if both else 1, reader_features=[feature] if both else None)
    driver = load_target({"target": "delta", "path": str(path), "queryid": QUERY})
    with pytest.raises(RegionalConfigError, match=f"(table feature '{feature}'.*regional does not write it|"
                                                  f"protocol regional does not write .*{feature})"):
        driver.open(KV)
    assert sorted(p.name for p in path.iterdir()) == ["_delta_log"]


def test_an_unknown_feature_and_a_newer_protocol_are_refused_by_name(tmp_path):
    path = make_table(tmp_path / "a", [field("k"), field("v", "long")], features=["fancyNewThing"])
    with pytest.raises(RegionalConfigError, match=r"table feature 'fancyNewThing'.*does not know it"):
        load_target({"target": "delta", "path": str(path), "queryid": QUERY}).open(KV)
    path = make_table(tmp_path / "b", [field("k"), field("v", "long")], reader=4, writer=8)
    with pytest.raises(RegionalConfigError, match="protocol regional does not write"):
        load_target({"target": "delta", "path": str(path), "queryid": QUERY}).open(KV)


def test_the_feature_using_domain_metadata_is_the_one_named(tmp_path):
    path = make_table(tmp_path / "t", [field("k"), field("v", "long")],
                      features=["domainMetadata", "rowTracking", "appendOnly"])
    with pytest.raises(RegionalConfigError, match="table feature 'rowTracking'"):
        load_target({"target": "delta", "path": str(path), "queryid": QUERY}).open(KV)


def test_an_identity_column_on_a_legacy_protocol_is_refused(tmp_path):
    path = make_table(tmp_path / "t", [field("id", "long", **{"delta.identity.start": 1, "delta.identity.step": 1}),
                                       field("k")], writer=6, reader=1)
    with pytest.raises(RegionalConfigError, match="identity column 'id'"):
        load_target({"target": "delta", "path": str(path), "queryid": QUERY}).open(pa.schema([("k", pa.string())]))


def test_every_known_feature_has_one_answer():
    assert not set(SUPPORTED) & set(REFUSED)


# -- constraints and NOT NULL ----------------------------------------------------------------------------------

def test_a_row_breaking_a_check_constraint_is_refused_in_the_task_and_its_files_removed(tmp_path):
    path = make_table(tmp_path / "t", [field("k"), field("v", "long")], writer=3, reader=1,
                      configuration={"delta.constraints.good": "v > 0 AND k <> 'BAD'"})
    driver, task = driver_and_task(path, KV)
    ok = task.prepare(0, "a", iter([batch(["x", "y"], [1, 2])]))
    with pytest.raises(RowsInvalid, match=r"1 of 2 rows break the Delta table's CHECK constraint good"):
        task.prepare(0, "b", iter([batch(["x"], [1]), batch(["BAD", "z"], [1, 2])]))
    with pytest.raises(RowsInvalid, match="CHECK constraint good"):  # null is not true: refused, as Spark
        task.prepare(0, "c", iter([batch(["x"], [None])]))
    assert sorted(p.name for p in path.glob("*.parquet")) == [ok["files"][0]["name"]]  # b's and c's: removed
    driver.commit(0, {"a": ok})
    assert rows_of(path) == [{"k": "x", "v": 1}, {"k": "y", "v": 2}]


def test_a_nullable_column_into_a_not_null_one_is_checked_row_by_row(tmp_path):
    path = make_table(tmp_path / "t", [field("k", nullable=False), field("v", "long")], writer=2, reader=1)
    driver, task = driver_and_task(path, KV)
    handle = task.prepare(0, "a", iter([batch(["x"], [1])]))
    with pytest.raises(RowsInvalid, match="null in column 'k', which is NOT NULL"):
        task.prepare(0, "b", iter([batch([None], [1])]))
    driver.commit(0, {"a": handle})
    assert rows_of(path) == [{"k": "x", "v": 1}]


def test_an_invariant_is_checked_and_a_constraint_regional_cannot_evaluate_is_refused_at_open(tmp_path):
    invariant = json.dumps({"expression": {"expression": "v < 10"}})
    path = make_table(tmp_path / "a", [field("k"), field("v", "long", **{"delta.invariants": invariant})],
                      writer=2, reader=1)
    _, task = driver_and_task(path, KV)
    with pytest.raises(RowsInvalid, match=r"invariant of v \(v < 10\)"):
        task.prepare(0, "a", iter([batch(["x"], [10])]))
    path = make_table(tmp_path / "b", [field("k"), field("v", "long")], writer=3, reader=1,
                      configuration={"delta.constraints.odd": "v % 2 = 1"})
    with pytest.raises(RegionalConfigError, match=r"CHECK constraint odd \(v % 2 = 1\).*cannot evaluate"):
        load_target({"target": "delta", "path": str(path), "queryid": QUERY}).open(KV)



def test_char_and_varchar_lengths_are_checked_in_characters(tmp_path):
    """delta-spark's __CHAR_VARCHAR_STRING_LENGTH_CHECK__: null or at most n characters; a CHAR/VARCHAR inside a
    struct is refused at open."""
    path = make_table(tmp_path / "t", [field("k", **{"__CHAR_VARCHAR_TYPE_STRING": "varchar(3)"}), field("v", "long")])
    driver, task = driver_and_task(path, KV)
    ok = task.prepare(0, "a", iter([batch(["é😀x", None, ""], [1, 2, 3])]))
    for long in ("abcd", "ab  "):
        with pytest.raises(RowsInvalid, match=r"length limit of k \(varchar\(3\)\)"):
            task.prepare(0, "b", iter([batch([long], [1])]))
    driver.commit(0, {"a": ok})
    assert len(rows_of(path)) == 3
    nested = {"type": "struct", "fields": [field("x")]}
    path = make_table(tmp_path / "n", [field("k"), field("v", "long"),
                                       field("s", nested, **{"__CHAR_VARCHAR_TYPE_STRING": "struct<x:char(2)>"})])
    with pytest.raises(RegionalConfigError, match="top-level CHAR/VARCHAR"):
        load_target({"target": "delta", "path": str(path), "queryid": QUERY}).open(KV)


def test_each_add_action_carries_min_max_and_null_counts(tmp_path):
    """The stats delta-spark's data skipping reads (compared with delta-spark's own in integration/)."""
    path = make_table(tmp_path / "t", [field("k"), field("v", "long")],
                      configuration={"delta.dataSkippingNumIndexedCols": "1"})
    driver, task = driver_and_task(path, KV)
    driver.commit(0, {"a": task.prepare(0, "a", iter([batch(["b", None], [5, 1]), batch(["a" * 40], [2])]))})
    log = (path / "_delta_log" / f"{1:020d}.json").read_text().splitlines()
    stats = json.loads(next(json.loads(line)["add"]["stats"] for line in log if '"add"' in line))
    assert stats == {"numRecords": 3, "minValues": {"k": "a" * 32}, "maxValues": {"k": "b"}, "nullCount": {"k": 1}}


# -- generated columns -----------------------------------------------------------------------------------------

def test_a_generated_column_left_out_is_computed_and_one_written_is_checked(tmp_path):
    path = make_table(tmp_path / "t", [field("k"), field("vlen", "integer",
                                                         **{"delta.generationExpression": "length(k)"})],
                      features=["generatedColumns", "appendOnly", "invariants"])
    query = pa.schema([("k", pa.string())])
    driver, task = driver_and_task(path, query)  # no mergeSchema needed: delta-spark computes it too
    handle = task.prepare(0, "a", iter([pa.record_batch({"k": ["ab", None, "héllo"]}, schema=query)]))
    driver.commit(0, {"a": handle})
    assert rows_of(path) == [{"k": "ab", "vlen": 2}, {"k": "héllo", "vlen": 5}, {"k": None, "vlen": None}]
    both = pa.schema([("k", pa.string()), ("vlen", pa.int32())])
    _, task = driver_and_task(path, both)
    task.prepare(1, "a", iter([pa.record_batch({"k": ["ab"], "vlen": pa.array([2], pa.int32())})]))
    with pytest.raises(RowsInvalid, match="generated column vlen"):
        task.prepare(1, "a", iter([pa.record_batch({"k": ["ab"], "vlen": pa.array([3], pa.int32())})]))


def test_a_generated_column_regional_cannot_compute_is_refused_by_name(tmp_path):
    day = field("d", "date", **{"delta.generationExpression": "CAST(t AS DATE)"})
    path = make_table(tmp_path / "t", [field("t", "timestamp"), day], features=["generatedColumns"])
    with pytest.raises(RegionalConfigError, match=r"generated column 'd' \(CAST\(t AS DATE\)\)"):
        load_target({"target": "delta", "path": str(path), "queryid": QUERY}).open(
            pa.schema([("t", pa.timestamp("us", "UTC"))]))


# -- column mapping --------------------------------------------------------------------------------------------

def mapped(name, physical, ident, kind="string"):
    return field(name, kind, **{"delta.columnMapping.physicalName": physical, "delta.columnMapping.id": ident})


@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapping_writes_physical_names_field_ids_and_physical_partition_keys(tmp_path, mode):
    struct = {"type": "struct", "fields": [mapped("a", "col-a", 4, "integer")]}
    path = make_table(tmp_path / "t", [mapped("k", "col-k", 1), mapped("v", "col-v", 2, "long"),
                                       mapped("s", "col-s", 3, struct), mapped("day", "col-day", 5)],
                      configuration={"delta.columnMapping.mode": mode, "delta.columnMapping.maxColumnId": "5"},
                      reader=2, features=["columnMapping"], partition_columns=["day"])
    query = pa.schema([("k", pa.string()), ("v", pa.int64()), ("s", pa.struct([("a", pa.int32())])),
                       ("day", pa.string())])
    driver, task = driver_and_task(path, query)
    rows = pa.record_batch({"k": ["x", "y"], "v": [1, 2], "s": [{"a": 7}, None], "day": ["d1", ""]}, schema=query)
    handle = task.prepare(0, "a", iter([rows]))
    assert sorted((str(f["partition"].get("col-day")), f["rows"]) for f in handle["files"]) == [("None", 1),
                                                                                                 ("d1", 1)]
    written = pq.read_schema(path / handle["files"][0]["name"])
    assert written.names == ["col-k", "col-v", "col-s"]
    assert [written.field(n).metadata[b"PARQUET:field_id"] for n in written.names] == [b"1", b"2", b"3"]
    assert written.field("col-s").type.field(0).name == "col-a"
    assert written.field("col-s").type.field(0).metadata[b"PARQUET:field_id"] == b"4"
    driver.commit(0, {"a": handle})
    assert rows_of(path) == [{"k": "x", "v": 1, "s": {"a": 7}, "day": "d1"},
                             {"k": "y", "v": 2, "s": None, "day": None}]


def test_merge_schema_adding_a_column_to_a_mapped_table_is_refused(tmp_path):
    path = make_table(tmp_path / "t", [mapped("k", "col-k", 1)], reader=2, features=["columnMapping"],
                      configuration={"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "1"})
    driver = load_target({"target": "delta", "path": str(path), "queryid": QUERY, "mergeschema": "true"})
    with pytest.raises(RegionalConfigError, match="mergeSchema adding columns to a table with column mapping"):
        driver.open(KV)


# -- partition values, mergeSchema, options --------------------------------------------------------------------

def test_an_empty_string_partition_value_is_null_as_delta_spark_writes_it(tmp_path):
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "t"), pa.table({"k": ["seed"], "day": ["d0"]}), partition_by=["day"])
    schema = pa.schema([("k", pa.string()), ("day", pa.string())])
    driver, task = driver_and_task(tmp_path / "t", schema)
    handle = task.prepare(0, "a", iter([pa.record_batch({"k": ["x", "y", "z"], "day": ["", None, "d1"]})]))
    assert sorted((str(f["partition"]["day"]), f["rows"]) for f in handle["files"]) == [("None", 2), ("d1", 1)]
    driver.commit(0, {"a": handle})
    assert sorted(map(str, DeltaTable(str(tmp_path / "t")).to_pyarrow_table().column("day").to_pylist())) == [
        "None", "None", "d0", "d1"]


def test_merge_schema_adds_a_non_nullable_query_column_nullable(tmp_path):
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "t"), pa.table({"k": ["old"]}))
    wider = pa.schema([("k", pa.string()), pa.field("one", pa.int32(), nullable=False)])
    driver, task = driver_and_task(tmp_path / "t", wider, mergeschema="true")
    handle = task.prepare(0, "a", iter([pa.record_batch({"k": ["new"], "one": pa.array([1], pa.int32())},
                                                        schema=wider)]))
    driver.commit(0, {"a": handle})
    table = DeltaTable(str(tmp_path / "t"))
    assert [(f.name, f.nullable) for f in table.schema().fields] == [("k", True), ("one", True)]
    assert rows_of(tmp_path / "t") == [{"k": "new", "one": 1}, {"k": "old", "one": None}]


def test_max_records_per_file_splits_and_user_metadata_reaches_the_commit(tmp_path):
    driver, task = driver_and_task(tmp_path / "t", KV, maxrecordsperfile="2", usermetadata="run 7")
    handle = task.prepare(0, "a", iter([batch(list("abc"), [1, 2, 3]), batch(list("de"), [4, 5])]))
    assert [f["rows"] for f in handle["files"]] == [2, 2, 1]
    driver.commit(0, {"a": handle})
    assert len(rows_of(tmp_path / "t")) == 5
    assert DeltaTable(str(tmp_path / "t")).history(1)[0]["userMetadata"] == "run 7"


def test_options_declare_delta_sparks_writer_options():
    names = {o.name for o in OPTIONS.options}
    for stock in ("path", "mergeSchema", "overwriteSchema", "replaceWhere", "partitionOverwriteMode", "txnAppId",
                  "txnVersion", "userMetadata", "maxRecordsPerFile", "optimizeWrite", "dataChange"):
        assert stock in names
    with pytest.raises(RegionalConfigError, match="compression='lzo'"):
        load_target({"target": "delta", "path": "/x", "queryid": QUERY, "compression": "lzo"})


# -- the expression evaluator ----------------------------------------------------------------------------------

SCHEMA = pa.schema([("s", pa.string()), ("n", pa.int64()), ("d", pa.decimal128(6, 2)), ("b", pa.bool_()),
                    ("day", pa.date32()), ("f", pa.float64())])
VALUES = {"s": pa.array(["a", "BAD", None, ""]), "n": pa.array([1, -5, None, 0]),
          "d": pa.array([__import__("decimal").Decimal(x) if x else None for x in ("1", "2", None, "3")],
                       pa.decimal128(6, 2)),
          "b": pa.array([True, False, None, True]), "day": pa.array([0, 1, None, 20000], pa.int32()).cast(pa.date32()),
          "f": pa.array([1.0, None, 0.0, 2.0])}


@pytest.mark.parametrize(("text", "want"), [
    ("n > 0", [True, False, None, False]),
    ("N >= 0 AND s <> 'BAD'", [True, False, None, True]),
    ("n > 0 OR s = ''", [True, False, None, True]),
    ("s IS NULL OR n IS NOT NULL", [True, True, True, True]),
    ("n IN (1, 0)", [True, False, None, True]),
    ("n NOT IN (1, NULL)", [False, None, None, None]),
    ("n BETWEEN -5 AND 0", [False, True, None, True]),
    ("NOT (n < 0)", [True, False, None, True]),
    ("length(s) < 3", [True, False, None, True]),
    ("n <=> NULL", [False, False, True, False]),
    ("d > 1.5", [False, True, None, True]),
    ("b", [True, False, None, True]),
    ("day >= DATE '1970-01-02'", [False, True, None, True]),
    ("`s` != \"a\"", [False, True, None, True]),
])
def test_expressions_have_sparks_three_valued_meaning(text, want):
    expr = sql.parse(text, SCHEMA)
    assert expr.evaluate(VALUES, 4).to_pylist() == want


@pytest.mark.parametrize("text", ["f > 0", "n + 1 > 0", "s = 1", "upper(s) = 'A'", "s = 'it''s'", "s = 'a\\'b'",
                                  "n > 1e3", "s LIKE 'a%'", "x > 0", "n > 0.5D", "CAST(n AS STRING) = '1'"])
def test_expressions_outside_the_language_are_unsupported(text):
    with pytest.raises(sql.Unsupported):
        sql.parse(text, SCHEMA)


def test_a_constraint_added_between_open_and_commit_keeps_the_epoch_unpublished(tmp_path):
    """The rows were checked for the table as open() saw it: a constraint added since (by another writer) makes
    the commit refuse, publishing nothing, rather than add rows that were never checked against it."""
    from regional.errors import RegionalStoreError

    path = make_table(tmp_path / "t", [field("k"), field("v", "long")], writer=3, reader=1,
                      configuration={"delta.constraints.a": "v > 0"})
    driver, task = driver_and_task(path, KV)
    handle = task.prepare(0, "a", iter([batch(["x"], [1])]))
    DeltaTable(str(path)).alter.add_constraint({"b": "v > 5"})
    with pytest.raises(RegionalStoreError, match="changed its rules"):
        driver.commit(0, {"a": handle})
    assert rows_of(path) == []
