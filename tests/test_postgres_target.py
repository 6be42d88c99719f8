"""target=postgres without a server: names, URLs, options, types and the CSV that COPY reads."""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal

import pyarrow as pa
import pytest

from regional.errors import RegionalConfigError
from regional.options import check_given
from regional.targets.postgres import (
    OPTIONS,
    Attempt,
    Gid,
    PostgresTarget,
    TableName,
    checkpoint_identity,
    current_attempt,
    encoder,
    gid_epoch,
    parse_table,
    pg_type,
    region_key,
)
from regional.targets.postgres.schema import (
    compatible,
    fits,
    match_columns,
    multidimensional_type,
    parse_column_types,
    writes_json,
)
from regional.targets.postgres.settings import Settings

URL = "postgresql://app@127.0.0.1:5432/db"


@pytest.mark.parametrize("text, want", [
    ("events", TableName(None, "events")),
    ("Public.Events", TableName("public", "events")),  # unquoted names fold to lower case, as in SQL
    ('"my.schema"."Odd ""name"""', TableName("my.schema", 'Odd "name"')),
    ('s."x; DROP TABLE y"', TableName("s", "x; DROP TABLE y")),
])
def test_table_names_parse_as_sql_reads_them(text, want):
    assert parse_table(text) == want


@pytest.mark.parametrize("text", ["", "a.b.c", "a.", '"open', '"a"b', ".a"])
def test_bad_table_names_are_refused(text):
    with pytest.raises(RegionalConfigError, match="table"):
        parse_table(text)


@pytest.mark.parametrize("options, message", [
    ({"url": "postgresql://app:secret@h/db", "table": "t"}, "holds a password"),
    ({"url": "postgresql://app@h/db?password=secret", "table": "t"}, "holds a password"),
    ({"url": URL, "table": "t", "password": "secret"}, "do not pass a 'password' option"),
    ({"url": "mysql://h/db", "table": "t"}, "must start with postgresql://"),
    ({"table": "t"}, "needs .option\\('url'"),
    ({"url": URL}, "needs .option\\('table'"),
])
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(RegionalConfigError, match=message):
        PostgresTarget({**options, "queryid": "q"})


def test_gids_are_bounded_and_name_their_epoch():
    key = region_key("a region/with\nanything" * 50)
    assert len(key) == 16 and key.isalnum()
    assert gid_epoch(f"regional:q:42:{key}:abc", "regional:q:") == 42
    assert gid_epoch("regional:q:x:y", "regional:q:") == -1


def test_gids_name_query_epoch_region_table_run_and_attempt_and_read_back_in_both_formats():
    query = "3febf566-bddc-441b-b38f-2e9c738e6d31"
    full = Gid(query, 2**63 - 1, region_key("r"), "0123456789ab", 4294967295, "22356665b2c540e4", 99999, 2**63 - 1)
    assert len(str(full)) < 200 and Gid.parse(str(full)) == full
    assert str(full).startswith(f"regional:{query}:{2**63 - 1}:{region_key('r')}:0123456789ab:t4294967295:")
    unknown = Gid(query, 3, region_key("r"), "abc", 16384)  # outside a Spark task: no run, partition, attempt
    assert str(unknown).endswith(":t16384:r-:p-:a-") and Gid.parse(str(unknown)) == unknown
    old = f"regional:{query}:7:{region_key('d')}:0123456789ab"  # the gid of earlier versions: no table
    assert Gid.parse(old) == Gid(query, 7, region_key("d"), "0123456789ab")
    assert str(Gid.parse(old)) == old
    for foreign in ("someone-else:1", f"regional:{query}:x:k:n", f"regional:{query}:1:k:n:x1:r-:p-:a-",
                    f"regional:{query}:1:k:n:t1:r-:p-", "regional"):
        assert Gid.parse(foreign) is None, foreign


def test_outside_a_spark_task_the_attempt_is_unknown():
    assert current_attempt() == Attempt(None, None, None, False)


def test_checkpoints_are_named_with_their_host_when_local_and_without_credentials_when_remote(tmp_path,
                                                                                            monkeypatch):
    import socket

    host = socket.gethostname()
    monkeypatch.chdir(tmp_path)
    assert checkpoint_identity("ck") == checkpoint_identity(str(tmp_path / "ck")) == \
        checkpoint_identity(f"file:{tmp_path}/ck") == f"file://{host}{tmp_path.resolve()}/ck"
    assert checkpoint_identity("s3a://key:secret@bucket/ck/") == "s3a://bucket/ck"
    assert checkpoint_identity(None) is None


def test_types_map_and_unknown_ones_are_refused():
    assert [pg_type(pa.field("x", t)) for t in (pa.string(), pa.int8(), pa.int64(), pa.float32(), pa.date32(),
                                                pa.timestamp("us", tz="UTC"), pa.timestamp("us"),
                                                pa.decimal128(12, 3), pa.list_(pa.int64()), pa.binary())] == [
        "text", "smallint", "bigint", "real", "date", "timestamp with time zone", "timestamp without time zone",
        "numeric(12,3)", "bigint[]", "bytea"]
    with pytest.raises(RegionalConfigError, match="column 'd' has type"):
        pg_type(pa.field("d", pa.duration("us")))


def test_rows_encode_as_postgres_csv_nulls_unquoted_and_empty_strings_quoted():
    batch = pa.record_batch({
        "s": ["a", "", None, 'x"y,z\nw'],
        "b": pa.array([b"\x00\xff", None, b"", b"A"], pa.binary()),
        "n": pa.array([Decimal("1.50"), None, Decimal("-2"), Decimal("0")], pa.decimal128(10, 2)),
        "t": pa.array([dt.datetime(2024, 1, 1, 1, 2, 3, 456789), None, dt.datetime(1960, 1, 1),
                       dt.datetime(2024, 2, 29)], pa.timestamp("us", tz="UTC")),
        "j": pa.array([{"k": 1}, None, {"k": None}, {"k": 2}], pa.struct([("k", pa.int64())])),
    })
    text = encoder(batch.schema)(batch).decode()
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["a", "\\x00ff", "1.50", "2024-01-01 01:02:03.456789", '{"k": 1}']
    assert text.splitlines()[1] == '"",,,,'  # an empty string is quoted; NULL is an unquoted empty field
    assert rows[2][1:] == ["\\x", "-2.00", "1960-01-01 00:00:00.000000", '{"k": null}']
    assert rows[3][0] == 'x"y,z\nw'


# -- what df.write.jdbc writes (issue 47) ----------------------------------------------------------------------


def encoded(batch: pa.RecordBatch, json_columns: tuple[str, ...] = ()) -> list[list[str]]:
    return list(csv.reader(io.StringIO(encoder(batch.schema, json_columns)(batch).decode())))


def test_zoned_timestamps_are_written_as_their_utc_instants_whatever_the_zones_offset_had_for_seconds():
    """Spark hands TimestampType over in the session time zone. pyarrow's CSV writer cut an offset with seconds to
    minutes (Monrovia was -0:44:30 until 1972, every zone had local mean time): instants came out up to 59 s early.
    They go as UTC wall-clock times, which the COPY's session (TimeZone UTC) reads as the same instants."""
    utc = dt.timezone.utc
    instants = [dt.datetime(1960, 1, 1, 0, 44, 30, 123456, tzinfo=utc),
                dt.datetime(1850, 6, 30, 11, 40, 28, 1, tzinfo=utc)]
    for zone in ("Africa/Monrovia", "Europe/Amsterdam", "Asia/Kolkata", "UTC"):
        column = pa.array(instants, pa.timestamp("us", tz="UTC")).cast(pa.timestamp("us", tz=zone))
        rows = encoded(pa.record_batch({"t": column, "a": pa.array([[v] for v in instants],
                                                                   pa.list_(pa.timestamp("us", tz=zone)))}))
        assert [r[0] for r in rows] == ["1960-01-01 00:44:30.123456", "1850-06-30 11:40:28.000001"], zone
        assert [r[1] for r in rows] == ['{"1960-01-01 00:44:30.123456"}', '{"1850-06-30 11:40:28.000001"}'], zone


def test_dates_and_timestamps_before_year_one_are_written_with_postgres_era():
    """Spark counts years as ISO 8601 does (proleptic Gregorian, a year 0); PostgreSQL writes 1 BC for year 0 and
    refuses ``0000-12-30`` (or misreads ``-0045-10-29`` as a zone): the year before 1 is 1 BC, -45 is 46 BC."""
    year_one_us = -62135596800 * 10 ** 6
    batch = pa.record_batch({
        "d": pa.array([-719163, -735000, -719162, None], pa.date32()),
        "t": pa.array([year_one_us - 1, year_one_us - 1 - 366 * 86_400 * 10 ** 6, year_one_us, None],  # 0 is leap
                      pa.timestamp("us", tz="Asia/Tokyo")),
        "n": pa.array([year_one_us - 500_000, None, 0, year_one_us], pa.timestamp("us")),
        "ad": pa.array([[-719163, None], [], None, [0]], pa.list_(pa.date32())),
        "st": pa.array([{"d": -719163, "t": year_one_us - 1}, {"d": 0, "t": 0}, None, {"d": None, "t": None}],
                       pa.struct([("d", pa.date32()), ("t", pa.timestamp("us", tz="Asia/Tokyo"))])),
    })
    rows = encoded(batch)
    assert rows[0] == ["0001-12-31 BC", "0001-12-31 23:59:59.999999 BC", "0001-12-31 23:59:59.500000 BC",
                       '{"0001-12-31 BC",NULL}', '{"d": "0000-12-31", "t": "0000-12-31T23:59:59.999999Z"}']
    assert rows[1][:2] == ["0044-08-22 BC", "0002-12-31 23:59:59.999999 BC"]
    assert rows[1][4] == '{"d": "1970-01-01", "t": "1970-01-01T00:00:00.000000Z"}'
    assert rows[2][:3] == ["0001-01-01", "0001-01-01 00:00:00.000000", "1970-01-01 00:00:00.000000"]
    assert rows[3] == ["", "", "0001-01-01 00:00:00.000000", '{"1970-01-01"}', '{"d": null, "t": null}']
    assert encoded(batch.slice(1)) == rows[1:]


def test_arrays_of_arrays_are_jsonb_unless_an_existing_array_column_takes_them_as_multidimensional_arrays():
    t = pa.list_(pa.list_(pa.int32()))
    batch = pa.record_batch({"a": pa.array([[[1, 2], [3, None]], [], None, [[4], None]], t),
                             "s": pa.array([[[['a,"b', None]]], None, [], [[["\\"]]]],
                                           pa.list_(pa.list_(pa.list_(pa.string()))))})
    assert encoded(batch) == [['[[1, 2], [3, null]]', '[[["a,\\"b", null]]]'], ["[]", ""], ["", "[]"],
                              ["[[4], null]", '[[["\\\\"]]]']]
    multidimensional = list(csv.reader(io.StringIO(encoder(batch.schema, (), ("a", "s"))(batch.slice(1)).decode())))
    assert multidimensional == [["{}", ""], ["", "{}"], ['{{"4"},NULL}', '{{{"\\\\"}}}']]
    assert encoder(batch.schema, (), ("a", "s"))(batch.slice(0, 1)).decode() == (
        '"{{""1"",""2""},{""3"",NULL}}","{{{""a,\\""b"",NULL}}}"\n')
    field = pa.field("a", t)
    assert multidimensional_type(field) == "integer[]" and multidimensional_type(pa.field("l", pa.list_(t))) \
        == "integer[]"
    assert multidimensional_type(pa.field("m", pa.list_(pa.list_(pa.struct([("x", pa.int8())]))))) is None
    assert fits(field, "bigint[]") and fits(field, "jsonb") and not fits(field, "text[]") and not fits(field, "text")
    assert not writes_json(field, "integer[]") and writes_json(field, "jsonb") and writes_json(field, None)


def test_arrays_become_postgres_array_literals_with_nan_infinities_nulls_and_quotes():
    batch = pa.record_batch({
        "d": pa.array([[1.5, float("nan"), float("inf"), float("-inf"), None], [], None], pa.list_(pa.float64())),
        "s": pa.array([['a,b"c{}\\', None, "NULL", ""], ["é\n"], None], pa.list_(pa.string())),
        "b": pa.array([[b"\x00\xff", None], [b""], None], pa.list_(pa.binary())),
        "n": pa.array([[Decimal("12345678901234567890.123456789012345678")], [], None],
                      pa.list_(pa.decimal128(38, 18))),
        "i": pa.array([[1, None], [-(2 ** 63)], None], pa.list_(pa.int64())),
    })
    rows = encoded(batch.slice(0))
    assert rows[0] == ['{"1.5","nan","inf","-inf",NULL}', '{"a,b\\"c{}\\\\",NULL,"NULL",""}', '{"\\\\x00ff",NULL}',
                       '{"12345678901234567890.123456789012345678"}', '{"1",NULL}']
    assert rows[1] == ["{}", '{"é\n"}', '{"\\\\x"}', "{}", '{"-9223372036854775808"}']
    assert rows[2] == ["", "", "", "", ""]  # a null array is NULL (an unquoted empty field)
    assert encoded(batch.slice(1, 1)) == [rows[1]]  # a slice's offsets do not start at 0


def test_what_goes_to_jsonb_is_written_as_sparks_to_json_writes_it():
    batch = pa.record_batch({
        "m": pa.array([[("k", 1.5), ("n", float("nan"))], [], None], pa.map_(pa.string(), pa.float64())),
        "st": pa.array([{"d": float("-inf"), "b": b"\x01", "t": dt.datetime(1960, 1, 1, tzinfo=dt.timezone.utc)},
                        {"d": None, "b": None, "t": None}, None],
                       pa.struct([("d", pa.float64()), ("b", pa.binary()),
                                  ("t", pa.timestamp("us", tz="Africa/Monrovia"))])),
        "a": pa.array([[float("inf")], [], None], pa.list_(pa.float64())),  # into an existing jsonb column
    })
    rows = encoded(batch, ("a",))
    assert rows[0] == ['{"k": 1.5, "n": "NaN"}', '{"d": "-Infinity", "b": "AQ==", "t": "1960-01-01T00:00:00.000000Z"}',
                       '["Infinity"]']
    assert rows[1] == ["{}", '{"d": null, "b": null, "t": null}', "[]"]  # an empty map is {}, not []
    assert rows[2] == ["", "", ""]


def test_types_are_those_spark_jdbc_creates_and_what_it_refuses_is_jsonb():
    got = {str(t): pg_type(pa.field("x", t)) for t in (
        pa.string(), pa.binary(), pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(),
        pa.float64(), pa.decimal128(38, 18), pa.date32(), pa.timestamp("us", tz="Africa/Monrovia"), pa.timestamp("us"),
        pa.list_(pa.float64()), pa.list_(pa.string()), pa.list_(pa.int8()), pa.list_(pa.timestamp("us", tz="UTC")),
        pa.list_(pa.decimal128(5, 2)), pa.list_(pa.binary()), pa.list_(pa.list_(pa.int32())),
        pa.map_(pa.string(), pa.int32()), pa.struct([("a", pa.int32())]))}
    assert list(got.values()) == [
        "text", "bytea", "boolean", "smallint", "smallint", "integer", "bigint", "real", "double precision",
        "numeric(38,18)", "date", "timestamp with time zone", "timestamp without time zone", "double precision[]",
        "text[]", "smallint[]", "timestamp with time zone[]", "numeric(5,2)[]", "bytea[]", "jsonb", "jsonb", "jsonb"]


def test_existing_columns_take_what_postgres_reads_without_rounding():
    assert compatible("integer[]", "integer[]") and compatible("integer[]", "bigint[]")
    assert compatible("double precision[]", "jsonb")  # a table an earlier regional made
    assert compatible("bigint", "smallint")  # out of range: the row's failure, as stock's INSERT
    assert not compatible("double precision", "integer") and not compatible("numeric(5,2)", "bigint")
    assert not compatible("text[]", "text") and not compatible("jsonb", "text[]")
    assert compatible("date", "timestamp without time zone") and not compatible("date", "timestamp with time zone")
    assert writes_json(pa.field("a", pa.list_(pa.int32())), "jsonb")
    assert not writes_json(pa.field("a", pa.list_(pa.int32())), "integer[]")


def test_column_names_are_matched_without_case_exact_first():
    assert match_columns(["ID", "value", "Value", "gone"], ["id", "Value", "value", "extra"]) == {
        "ID": "id", "value": "value", "Value": "Value", "gone": None}


@pytest.mark.parametrize("text, want", [
    ("code VARCHAR(8)", {"code": "character varying(8)"}),
    ("code varchar( 8 ), `Odd, name` CHAR(3) NOT NULL, n INTEGER COMMENT 'x, y', d DECIMAL(10, 2), e DEC, "
     "l LONG, t TIMESTAMP", {"code": "character varying(8)", "Odd, name": "character(3)", "n": "integer",
                             "d": "numeric(10,2)", "e": "numeric(10,0)", "l": "bigint",
                             "t": "timestamp with time zone"}),
    # Spark's PostgreSQL dialect, as for the query's own columns (issue 59): no catalogString PostgreSQL lacks
    # (tinyint, string, double, binary) or reads otherwise (float: double precision; timestamp: without time zone)
    ("code TINYINT, n FLOAT, d DOUBLE, e STRING, l BINARY, t TIMESTAMP_NTZ",
     {"code": "smallint", "n": "real", "d": "double precision", "e": "text", "l": "bytea",
      "t": "timestamp without time zone"}),
    ("code ARRAY<VARCHAR(3)>, n array < decimal(5,1) >, t ARRAY<TIMESTAMP>",
     {"code": "character varying(3)[]", "n": "numeric(5,1)[]", "t": "timestamp with time zone[]"}),
])
def test_create_table_column_types_are_read_as_spark_reads_them(text, want):
    columns = ["CODE", "Odd, name", "n", "d", "e", "l", "t"]
    assert parse_column_types(text, columns).types == want
    assert parse_column_types(text, columns).type_of("Code") == want["code"]


@pytest.mark.parametrize("text, message", [
    ("nope INT", "names column 'nope', which the query does not write"),
    ("code INT, CODE INT", "names column 'CODE' twice"),
    ("code", "is not 'column TYPE'"),
    ("code INT,", "has an empty column"),
    ("code array<array<int>>", "is not a Spark SQL scalar type or an array of one"),
    ("code map<string, int>", "is not a Spark SQL scalar type or an array of one"),
    ("code DECIMAL(40,2)", "is not a Spark decimal"),
])
def test_bad_create_table_column_types_are_refused(text, message):
    with pytest.raises(RegionalConfigError, match=message):
        parse_column_types(text, ["code"])


@pytest.mark.parametrize("options, message", [
    ({"truncate": "true"}, "truncate='true'.*mode overwrite"),
    ({"cascadetruncate": "true"}, "cascadetruncate='true'"),
    ({"isolationlevel": "NONE"}, "isolationLevel=NONE would write without a transaction"),
    ({"isolationlevel": "chaos"}, "is not one of READ_UNCOMMITTED"),
    ({"querytimeout": "-1"}, "queryTimeout='-1' must be a whole number"),
    ({"stringtype": "varchar"}, "stringtype='varchar'"),
    ({"driver": "com.mysql.Driver"}, "driver='com.mysql.Driver'"),
    ({"dbtable": "t"}, "give 'table' or Spark's 'dbtable', not both"),
    ({"url": "jdbc:postgresql://h/db?reWriteBatchedInserts=true"}, "not one libpq reads.*reWriteBatchedInserts"),
    ({"url": "jdbc:postgresql://h/db?user=u&password=p"}, "holds a password"),
])
def test_jdbc_options_with_values_regional_cannot_honour_are_refused(options, message):
    with pytest.raises(RegionalConfigError, match=message):
        Settings.of({"url": URL, "table": "t", **options})


def test_jdbc_options_regional_honours_are_read():
    got = Settings.of({"url": "jdbc:postgresql://127.0.0.1:5432/db?sslmode=disable", "dbtable": "S.T",
                       "isolationlevel": "serializable", "querytimeout": "30", "truncate": "false",
                       "stringtype": "unspecified", "driver": "org.postgresql.Driver", "user": "app",
                       "createtableoptions": " WITH (fillfactor=70) "})
    assert (got.url, got.table, got.isolation_level, got.query_timeout_s, got.user, got.table_options) == (
        "postgresql://127.0.0.1:5432/db?sslmode=disable", TableName("s", "t"), "SERIALIZABLE", 30, "app",
        "WITH (fillfactor=70)")


# Spark 4.2's JDBCOptions (every name it declares), and the connection properties users pass with them.
SPARK_JDBC_OPTIONS = [
    "url", "dbtable", "query", "driver", "partitionColumn", "lowerBound", "upperBound", "numPartitions",
    "queryTimeout", "fetchsize", "truncate", "cascadeTruncate", "createTableOptions", "createTableColumnTypes",
    "customSchema", "batchsize", "isolationLevel", "sessionInitStatement", "pushDownPredicate", "pushDownAggregate",
    "pushDownLimit", "pushDownOffset", "pushDownTableSample", "keytab", "principal", "tableComment",
    "refreshKrb5Config", "connectionProvider", "prepareQuery", "preferTimestampNTZ", "user", "password",
    "stringtype",
]


def test_every_option_of_sparks_jdbc_writer_is_declared_with_regionals_answer():
    missing = [name for name in SPARK_JDBC_OPTIONS if OPTIONS.find(name) is None]
    assert not missing
    assert all(OPTIONS.find(name).stock for name in SPARK_JDBC_OPTIONS)
    assert OPTIONS.find("PASSWORD").refused and OPTIONS.find("customschema").refused
    with pytest.raises(RegionalConfigError, match="'batchsize' is not supported by regional: regional writes each"):
        check_given("writeStream", {"batchSize": "1000"}, [OPTIONS])
    with pytest.raises(RegionalConfigError, match=r"'createTableColumTypes' is not an option.*Did you mean"):
        check_given("writeStream", {"createTableColumTypes": "a INT"}, [OPTIONS])
