"""target=postgres against the stock piece it replaces, Spark's JDBC writer (``df.write.jdbc`` with the PostgreSQL JDBC
driver from Maven Central), into the same real server: the same rows through both, read back by the same SQL and
compared row by row and column by column (issue 47).

Every Spark type Spark's JDBC writer takes (NaN and infinities, nested in arrays too; decimals at full precision;
binary; dates; timestamps in session time zones whose offset had seconds: local mean time), the tables both create
(createTableColumnTypes honoured), column names matched without case against an existing table; what the stock
writer refuses (maps, structs, arrays of binary) or creates otherwise (arrays of arrays: jsonb, not integer[]) regional
writes as documented (docs/targets/postgres.md's differences); options neither
knows are refused by name; a row PostgreSQL refuses is dead-lettered, every other row lands once.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

import regional
from integration.helpers import add_epoch_of_files, error_of, regional_stream
from regional.store.model import Standing
from regional.testing import maven

JDBC_DRIVER = "org.postgresql:postgresql:42.7.8"
ROWS = 6  # offsets 0..5 of region a: each expression picks its value by offset


def pick(*values: str) -> str:
    assert len(values) == ROWS
    return f"element_at(array({', '.join(values)}), CAST(offset AS INT) + 1)"


TIMESTAMPS = ("'1960-01-01 00:00:00.123456'", "'1900-01-01 00:00:00'", "'1850-06-30 12:00:00.000001'",
              "'2024-03-31 02:30:00'", "'2024-10-27 02:30:00'", "'1971-12-31 23:59:59.999999'")
# Columns both writers take, as Spark SQL over (region, offset, value).
BOTH = [
    "value AS s",
    pick("'x\"y,z\nw'", "''", "CAST(NULL AS STRING)", "'back\\\\slash {braces} \"q\"'", "'é\t'", "value") + " AS t",
    pick("'abc'", "'abcdefgh'", "''", "CAST(NULL AS STRING)", "'x'", "'12345678'") + " AS code",
    "CAST(offset - 3 AS TINYINT) AS tiny", "CAST(offset * -1000 AS SMALLINT) AS short",
    pick("2147483647", "-2147483648", "0", "CAST(NULL AS INT)", "1", "-1") + " AS i",
    pick("9223372036854775807L", "-9223372036854775808L", "0L", "CAST(NULL AS BIGINT)", "1L", "-1L") + " AS l",
    pick("float('NaN')", "float('Infinity')", "float('-Infinity')", "CAST(1.1 AS FLOAT)", "CAST(3.4028235E38 AS FLOAT)",
         "CAST(1.4E-45 AS FLOAT)") + " AS f",
    pick("double('NaN')", "double('Infinity')", "double('-Infinity')", "0.1D", "4.9E-324D", "-0.0D") + " AS d",
    pick("CAST('12345678901234567890.123456789012345678' AS DECIMAL(38,18))",
         "CAST('-0.000000000000000001' AS DECIMAL(38,18))", "CAST(0 AS DECIMAL(38,18))",
         "CAST(NULL AS DECIMAL(38,18))", "CAST('99999999999999999999.999999999999999999' AS DECIMAL(38,18))",
         "CAST(1 AS DECIMAL(38,18))") + " AS dec",
    "CAST(offset AS DECIMAL(5,2)) + 0.25 AS dec2",
    pick("true", "false", "CAST(NULL AS BOOLEAN)", "true", "false", "true") + " AS bo",
    pick("DATE'2024-02-29'", "DATE'1900-01-01'", "DATE'1970-01-01'", "DATE'1600-03-01'", "CAST(NULL AS DATE)",
         "DATE'9999-12-31'") + " AS dt",
    pick(*(f"TIMESTAMP{t}" for t in TIMESTAMPS)) + " AS ts",
    pick(*(f"TIMESTAMP_NTZ{t}" for t in TIMESTAMPS)) + " AS ntz",
    pick("X''", "X'00FF'", "CAST(NULL AS BINARY)", "X'5C78'", "CAST(value AS BINARY)", "X'22'") + " AS bin",
    pick("array(1.5D, double('NaN'), double('Infinity'), double('-Infinity'), NULL)",
         "CAST(array() AS ARRAY<DOUBLE>)", "CAST(NULL AS ARRAY<DOUBLE>)", "array(0.1D, -0.0D, 4.9E-324D)",
         "array(double('NaN'))", "array(1D)") + " AS ad",
    pick("array(float('NaN'), float('-Infinity'), CAST(1.1 AS FLOAT))", "CAST(array() AS ARRAY<FLOAT>)",
         "CAST(NULL AS ARRAY<FLOAT>)", "array(CAST(NULL AS FLOAT))", "array(float('Infinity'))",
         "array(CAST(3.4028235E38 AS FLOAT))") + " AS af",
    pick("array(1, NULL, -2147483648)", "CAST(array() AS ARRAY<INT>)", "CAST(NULL AS ARRAY<INT>)", "array(0)",
         "array(2147483647)", "array(CAST(NULL AS INT))") + " AS ai",
    "array(offset, offset * 10000000000) AS al",
    "array(CAST(offset AS SMALLINT), CAST(-offset AS TINYINT)) AS ash",
    pick("array('a,b', 'c\"d', 'e\\\\f', '{g}', NULL, 'NULL')", "CAST(array() AS ARRAY<STRING>)",
         "CAST(NULL AS ARRAY<STRING>)", "array('', ' ', 'é\n')", "array(value)", "array('x y')") + " AS ast",
    pick("array(true, false, NULL)", "CAST(array() AS ARRAY<BOOLEAN>)", "CAST(NULL AS ARRAY<BOOLEAN>)",
         "array(true)", "array(false)", "array(CAST(NULL AS BOOLEAN))") + " AS abo",
    pick("array(DATE'2024-02-29', NULL)", "CAST(array() AS ARRAY<DATE>)", "CAST(NULL AS ARRAY<DATE>)",
         "array(DATE'1600-03-01')", "array(DATE'9999-12-31')", "array(DATE'1970-01-01')") + " AS adt",
    f"array({', '.join(f'TIMESTAMP{t}' for t in TIMESTAMPS)}) AS ats",
    f"array({', '.join(f'TIMESTAMP_NTZ{t}' for t in TIMESTAMPS)}) AS antz",
    pick("array(CAST('12345678901234567890.123456789012345678' AS DECIMAL(38,18)), NULL)",
         "CAST(array() AS ARRAY<DECIMAL(38,18)>)", "CAST(NULL AS ARRAY<DECIMAL(38,18)>)",
         "array(CAST('-0.000000000000000001' AS DECIMAL(38,18)))", "array(CAST(0 AS DECIMAL(38,18)))",
         "array(CAST(1 AS DECIMAL(38,18)))") + " AS adec",
]
# What Spark's JDBC writer refuses ("Can't get JDBC type"; arrays of binary fail in the driver), and an array of
# arrays (stock: integer[], refusing a ragged one; regional: jsonb, issue 59): regional's own.
REGIONAL_ONLY = [
    pick("map('k', 1.5D, 'n', double('NaN'))", "CAST(map() AS MAP<STRING, DOUBLE>)",
         "CAST(NULL AS MAP<STRING, DOUBLE>)", "map('i', double('-Infinity'))",
         "map('x', CAST(NULL AS DOUBLE))", "map(value, 0D)") + " AS m",
    "named_struct('n', offset, 'd', double('Infinity'), 'b', X'01', 'ts', TIMESTAMP'1960-01-01 00:00:00') AS st",
    "array(X'00FF', CAST(NULL AS BINARY), X'5C') AS abin",
    "array(array(offset), CAST(array() AS ARRAY<BIGINT>)) AS aa",
]
COLUMN_TYPES = "code VARCHAR(8), `dec2` DECIMAL(7,3)"
KEY = '"region", "offset"'


@pytest.fixture(scope="module")
def jdbc(spark, postgres):
    """Spark's JDBC writer into the test server: the PostgreSQL JDBC driver (Maven Central, cached) added to the
    running session, as ``ADD JAR`` does for a user."""
    jar = next(maven.fetch("postgresql-jdbc-42.7.8", [JDBC_DRIVER], transitive=False).glob("postgresql-*.jar"))
    spark.sql(f"ADD JAR '{jar}'")
    return (f"jdbc:postgresql://127.0.0.1:{postgres.port}/postgres",
            {"user": "postgres", "driver": "org.postgresql.Driver"})


def start(df, postgres, table: str, ck: Path, **options: str):
    writer = (df.writeStream.format("regional").option("target", "postgres").option("url", postgres.url)
              .option("table", table).option("keepRegionColumns", "true").option("checkpointLocation", str(ck)))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def run(query) -> None:
    try:
        query.processAllAvailable()
        assert query.exception() is None, query.exception()
    finally:
        query.stop()


def _run_until(query, done, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    try:
        while not done():
            assert query.isActive and query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"not done after {timeout} s"
            time.sleep(1)
    finally:
        query.stop()


def the_input(spark, inp: Path, ck: Path):
    """Region a's records through regional's source, and the same rows as a batch DataFrame for the stock writer."""
    values = add_epoch_of_files(inp, ["a"], "001", ROWS)["a"]
    stream = regional_stream(spark, inp, ck).select("region", "offset", "value")
    static = spark.createDataFrame([("a", o, v) for o, v in enumerate(values)], stream.schema)
    return stream, static


def columns(postgres, table: str) -> list[tuple]:
    with postgres.connect() as conn:
        return conn.execute(
            "SELECT column_name, data_type, udt_name, character_maximum_length, numeric_precision, numeric_scale, "
            "is_nullable FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
            (table,)).fetchall()


def rows_as_text(postgres, table: str, names: list[str]) -> list[tuple]:
    """Every value as PostgreSQL prints it (the session's TimeZone is UTC), in key order."""
    select = ", ".join(f'"{n}"::text' for n in names)
    with postgres.connect() as conn:
        conn.execute("SET TimeZone = 'UTC'")
        return conn.execute(f'SELECT {select} FROM "{table}" ORDER BY {KEY}').fetchall()


def assert_same_rows(postgres, mine: str, stock: str, names: list[str]) -> None:
    got, want = rows_as_text(postgres, mine, names), rows_as_text(postgres, stock, names)
    assert len(got) == len(want) == ROWS, (len(got), len(want))
    for row_got, row_want in zip(got, want, strict=True):
        differ = {n: (g, w) for n, g, w in zip(names, row_got, row_want, strict=True) if g != w}
        assert not differ, f"row {row_want[:2]}: column: (regional, stock): {differ}"


@pytest.mark.parametrize("zone", ["UTC", "Africa/Monrovia", "Europe/Amsterdam"])
def test_every_type_lands_as_spark_jdbc_writes_it_in_every_session_time_zone(spark, postgres, jdbc, tmp_path, zone):
    """Monrovia's offset was -0:44:30 until 1972 and every zone had local mean time before about 1900 (offsets with
    seconds); 2024-03-31 02:30 does not exist in Amsterdam and 2024-10-27 02:30 happens twice there."""
    url, properties = jdbc
    name = zone.replace("/", "_").lower()
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        stream, static = the_input(spark, tmp_path / "in", tmp_path / "ck")
        run(start(stream.selectExpr("region", "offset", *BOTH, *REGIONAL_ONLY), postgres, f"mine_{name}",
                  tmp_path / "ck", createTableColumnTypes=COLUMN_TYPES))
        static.selectExpr("region", "offset", *BOTH).write.option("createTableColumnTypes", COLUMN_TYPES).jdbc(
            url, f"stock_{name}", mode="append", properties=properties)
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
    mine, stock = columns(postgres, f"mine_{name}"), columns(postgres, f"stock_{name}")
    assert mine[:len(stock)] == stock  # the same columns, types, lengths, precisions and nullability
    assert ("code", "character varying", "varchar", 8, None, None, "YES") in stock
    names = [c[0] for c in stock]
    assert_same_rows(postgres, f"mine_{name}", f"stock_{name}", names)
    # What only regional writes: jsonb as Spark's to_json writes it (NaN and infinities as strings, binary as
    # base64, an empty map {}, timestamps as UTC instants), arrays of binary as bytea[], arrays of arrays as jsonb.
    assert [c[1:3] for c in mine[len(stock):]] == [("jsonb", "jsonb"), ("jsonb", "jsonb"), ("ARRAY", "_bytea"),
                                                   ("jsonb", "jsonb")]
    extra = rows_as_text(postgres, f"mine_{name}", ["m", "st", "abin", "aa"])
    assert [r[0] for r in extra] == ['{"k": 1.5, "n": "NaN"}', "{}", None, '{"i": "-Infinity"}', '{"x": null}',
                                     '{"a-001-5": 0.0}']
    instant = {"UTC": "1960-01-01T00:00:00.000000Z", "Africa/Monrovia": "1960-01-01T00:44:30.000000Z",
               "Europe/Amsterdam": "1959-12-31T23:00:00.000000Z"}
    assert extra[0][1] == f'{{"b": "AQ==", "d": "Infinity", "n": 0, "ts": "{instant[zone]}"}}'  # jsonb's key order
    assert {r[2] for r in extra} == {'{"\\\\x00ff",NULL,"\\\\x5c"}'}
    assert extra[1][3] == "[[1], []]"


NESTED = [  # arrays of arrays into existing array columns, as multidimensional arrays (issue 59, item 12e)
    pick("array(array(CAST(offset AS INT), 2), array(3, NULL))", "CAST(array() AS ARRAY<ARRAY<INT>>)",
         "CAST(NULL AS ARRAY<ARRAY<INT>>)", "array(array(-2147483648))", "array(array(1, 2, 3))",
         "array(array(CAST(NULL AS INT)))") + " AS nested",
    "array(array(array('a,b', NULL), array('\"q\"', '{x}')), array(array('back\\\\slash', ''), "
    "array('NULL', value))) AS deep",
]


def test_an_existing_table_is_matched_without_case_as_spark_jdbc_matches_it(spark, postgres, jdbc, tmp_path):
    """The table says id and "Value" and has a column with a default; the query says ID and value. Arrays of arrays
    go into its array columns as Spark's JDBC writer writes them (a table it created has integer[] for them)."""
    url, properties = jdbc
    with postgres.connect() as conn:
        for table in ("cased_mine", "cased_stock"):
            conn.execute(f'CREATE TABLE {table} (region text, "offset" bigint, id bigint, "Value" text, '
                         "ints integer[], added text NOT NULL DEFAULT 'default', nested bigint[], deep text[])")
    stream, static = the_input(spark, tmp_path / "in", tmp_path / "ck")
    select = ["region", "offset", "offset * 7 AS ID", "value AS value", "array(CAST(offset AS INT), NULL) AS INTS",
              *NESTED]
    run(start(stream.selectExpr(*select), postgres, "cased_mine", tmp_path / "ck"))
    static.selectExpr(*select).write.jdbc(url, "cased_stock", mode="append", properties=properties)
    assert_same_rows(postgres, "cased_mine", "cased_stock", ["region", "offset", "id", "Value", "ints", "added",
                                                             "nested", "deep"])
    assert [r[0] for r in rows_as_text(postgres, "cased_mine", ["nested"])] == [
        "{{0,2},{3,NULL}}", "{}", None, "{{-2147483648}}", "{{1,2,3}}", "{{NULL}}"]
    assert rows_as_text(postgres, "cased_mine", ["deep"])[0] == (
        '{{{"a,b",NULL},{"\\"q\\"","{x}"}},{{"back\\\\slash",""},{"NULL",a-001-0}}}',)
    assert rows_as_text(postgres, "cased_mine", ["id", "Value", "ints", "added"])[1] == ("7", "a-001-1", "{1,NULL}",
                                                                                         "default")


def test_options_neither_writer_knows_are_refused_by_name_and_refused_stock_options_say_why(spark, postgres,
                                                                                             tmp_path):
    stream, _static = the_input(spark, tmp_path / "in", tmp_path / "ck")
    df = stream.select("region", "offset", "value")
    cases = {  # each start is a few Python processes: the rest is tests/test_postgres_target.py's, without Spark
        "createTableColumTypes": "'createTableColumTypes' is not an option.*Did you mean 'createTableColumnTypes'",
        "batchsize": "'batchsize' is not supported by regional: regional writes each region's slice with one COPY",
    }
    for option, message in cases.items():
        got = error_of(lambda option=option: start(df, postgres, "refused", tmp_path / "ck", **{option: "x"}))
        assert re.search(message, got, re.I), (option, got[-1500:])
    got = error_of(lambda: start(df, postgres, "refused", tmp_path / "ck", truncate="true"))
    assert "truncate='true'" in got and "mode overwrite" in got, got[-1500:]
    with postgres.connect() as conn:
        assert conn.execute("SELECT to_regclass('refused')").fetchone() == (None,)


CHECKED = ('CREATE TABLE {} (region text, "offset" bigint, value text CHECK (value <> \'a-001-7\'), '
           'maybe text NOT NULL, small smallint, PRIMARY KEY (region, "offset"))')
# The record each region's table refuses, and PostgreSQL's SQLSTATE for it: a CHECK constraint, a NOT NULL column, a
# value out of the column's range, the primary key (a row with d@6's key is in the table before the query).
REFUSED = {("a", 7): "23514", ("b", 4): "23502", ("c", 3): "22003", ("d", 6): "23505"}


def checked_rows(spark, inp: Path, ck: Path):
    return regional_stream(spark, inp, ck).selectExpr(
        "region", "offset", "value", "CASE WHEN value = 'b-001-4' THEN NULL ELSE value END AS maybe",
        "CASE WHEN value = 'c-001-3' THEN 40000 ELSE offset END AS small")


def committed(ck: Path) -> dict[str, int]:
    return {r: s.committed_offset for r, s in regional.status(ck).regions.items()}


def test_a_row_postgres_refuses_is_dead_lettered_and_every_other_row_lands_once(spark, postgres, tmp_path):
    """Each of four regions has a record its table refuses (SQLSTATE classes 22 and 23: ``REFUSED``). Without dead
    letters, such a region falls back, quarantined, its status naming PostgreSQL's refusal, and publishes nothing,
    while a healthy region goes on. With dead letters, each refused record is isolated and dead-lettered with
    PostgreSQL's error, and every other record is published exactly once: the records beside it are probed against
    an empty copy of the table (the table holds those before it already: its primary key would refuse them)."""
    ck = tmp_path / "ck-plain"
    values = add_epoch_of_files(tmp_path / "in-plain", ["a", "e"], "001", 10)
    with postgres.connect() as conn:
        conn.execute(CHECKED.format("plain"))
    query = start(checked_rows(spark, tmp_path / "in-plain", ck), postgres, "plain", ck)
    refusal = "refused the rows (SQLSTATE 23514): new row for relation \"plain\" violates check constraint"

    def a_falls_back_and_e_goes_on() -> bool:
        status = regional.status(ck).regions
        return ("a" in status and "e" in status and status["e"].committed_offset == 10
                and status["a"].state is Standing.QUARANTINED and refusal in (status["a"].reason or ""))

    _run_until(query, a_falls_back_and_e_goes_on)
    assert committed(ck) == {"a": 0, "e": 10}
    with postgres.connect() as conn:
        landed = conn.execute('SELECT region, "offset", value FROM plain ORDER BY region, "offset"').fetchall()
    assert landed == [("e", o, v) for o, v in enumerate(values["e"])]

    inp, ck, dlq = tmp_path / "in", tmp_path / "ck", tmp_path / "dead-letters"
    inputs = add_epoch_of_files(inp, ["a", "b", "c", "d"], "001", 10)
    with postgres.connect() as conn:
        conn.execute(CHECKED.format("checked"))
        conn.execute("INSERT INTO checked VALUES ('d', 6, 'before', 'before', 0)")
    query = start(checked_rows(spark, inp, ck), postgres, "checked", ck, deadLetterPath=str(dlq))
    # A region stuck for ever fails the test instead of hanging it.
    _run_until(query, lambda: committed(ck) == {"a": 10, "b": 10, "c": 10, "d": 10})
    with postgres.connect() as conn:
        landed = conn.execute('SELECT region, "offset", value FROM checked ORDER BY region, "offset"').fetchall()
    assert landed == sorted([("d", 6, "before")] + [(r, o, v) for r, rows in inputs.items()
                                                     for o, v in enumerate(rows) if (r, o) not in REFUSED])
    letters = sorted(DeltaTable(str(dlq)).to_pyarrow_table().to_pylist(), key=lambda r: (r["region"], r["offset"]))
    assert [(r["region"], r["offset"], r["value"]) for r in letters] == [
        (r, o, inputs[r][o]) for r, o in sorted(REFUSED)]
    for letter in letters:  # the exception as Python names it (its module's path), then PostgreSQL's message
        state = REFUSED[letter["region"], letter["offset"]]
        # a unique key is about other rows too: refused on evidence (RowsRejected); the rest are the row's own fault
        kind = "RowsRejected" if state == "23505" else "RowsInvalid"
        assert letter["error"].startswith(
            f"regional.targets.base.{kind}: target=postgres: table checked refused the rows (SQLSTATE {state}): "
        ), letter["error"]
    assert {s.state for s in regional.status(ck).regions.values()} == {Standing.OK}
    with postgres.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)


# Issue 59, items 11 and 12: dates and timestamps before year 1 (Spark's proleptic Gregorian years 0, -45, ...:
# PostgreSQL's 1 BC, 46 BC, ...), createTableColumnTypes as Spark's PostgreSQL dialect reads it, with the NOT NULL of
# a non-nullable column, and arrays of arrays.
BEFORE_YEAR_ONE = ("'0000-12-30 01:02:03.456789'", "'-0045-10-29 23:59:59.999999'", "'0001-01-01 00:00:00'",
                   "'-0001-01-01 00:00:00.5'", "'1582-10-04 12:00:00.000001'", "'-0100-02-28 00:00:00.000001'")
ANCIENT = [
    pick("DATE'0000-12-30'", "DATE'-0045-10-29'", "DATE'0001-01-01'", "DATE'-0001-01-01'", "DATE'1582-10-04'",
         "CAST(NULL AS DATE)") + " AS dt",
    pick(*(f"TIMESTAMP{t}" for t in BEFORE_YEAR_ONE)) + " AS ts",
    pick(*(f"TIMESTAMP_NTZ{t}" for t in BEFORE_YEAR_ONE)) + " AS ntz",
    "CAST(offset AS STRING) AS code",
    "TIMESTAMP'2024-01-01 12:00:00' + make_interval(0, 0, 0, CAST(offset AS INT)) AS ts2",
    "CAST(offset AS FLOAT) / 3 AS f", "CAST(offset AS DOUBLE) / 3 AS dbl", "CAST(offset AS TINYINT) AS tiny",
    "CAST(offset AS INT) AS widened", "value AS s2", "TIMESTAMP_NTZ'2024-01-01 12:00:00' AS ntz2",
    "CAST(value AS BINARY) AS bin", "CAST(offset AS DECIMAL(9,2)) AS dec", "array(CAST(offset AS INT)) AS ai",
]
ANCIENT_TYPES = ("code VARCHAR(4), ts2 TIMESTAMP, f FLOAT, dbl DOUBLE, tiny TINYINT, widened BIGINT, s2 STRING, "
                 "ntz2 TIMESTAMP_NTZ, bin BINARY, dec DECIMAL, ai ARRAY<INT>")


def test_dates_before_year_one_and_create_table_column_types_land_as_spark_jdbc_writes_them(spark, postgres, jdbc,
                                                                                           tmp_path):
    url, properties = jdbc
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        stream, static = the_input(spark, tmp_path / "in", tmp_path / "ck")
        nested = ["array(array(CAST(offset AS INT), 2), array(3, NULL)) AS aa",
                  "array(DATE'0000-12-30', DATE'-0045-10-29') AS adt"]
        run(start(stream.selectExpr("region", "offset", *ANCIENT, *nested), postgres, "ancient_mine",
                  tmp_path / "ck", createTableColumnTypes=ANCIENT_TYPES))
        static.selectExpr("region", "offset", *ANCIENT, *nested).write.option(
            "createTableColumnTypes", ANCIENT_TYPES).jdbc(url, "ancient_stock", mode="append", properties=properties)
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
    mine, stock = columns(postgres, "ancient_mine"), columns(postgres, "ancient_stock")
    assert mine[:-2] == stock[:-2]  # the same types, lengths, precisions and NOT NULL
    nullable = {c[0]: c[6] for c in stock}  # NOT NULL with a createTableColumnTypes type: ntz2, ai
    assert {c[0]: c[2] for c in stock}["ts2"] == "timestamptz" and nullable["ntz2"] == nullable["ai"] == "NO"
    names = [c[0] for c in stock][:-2]
    assert_same_rows(postgres, "ancient_mine", "ancient_stock", names)
    assert [r[:3] for r in rows_as_text(postgres, "ancient_mine", ["dt", "ts", "ntz"])][:2] == [
        ("0001-12-30 BC", "0001-12-30 01:02:03.456789+00 BC", "0001-12-30 01:02:03.456789 BC"),
        ("0046-10-29 BC", "0046-10-29 23:59:59.999999+00 BC", "0046-10-29 23:59:59.999999 BC")]
    # Deliberate differences (docs/targets/postgres.md): an array of arrays is jsonb (Spark's JDBC writer creates
    # integer[], which refuses an array whose arrays differ in length or hold a null array, failing the whole
    # write); an array of dates before year 1 is the same dates (the stock driver prints each as java.sql.Date
    # does, without its era: 1 BC lands as 1 AD, 46 BC as 46 AD).
    assert mine[-2:] == [("aa", "jsonb", "jsonb", None, None, None, "NO"),
                         ("adt", "ARRAY", "_date", None, None, None, "NO")]
    assert stock[-2:] == [("aa", "ARRAY", "_int4", None, None, None, "NO"),
                          ("adt", "ARRAY", "_date", None, None, None, "NO")]
    assert rows_as_text(postgres, "ancient_mine", ["aa", "adt"])[1] == ("[[1, 2], [3, null]]",
                                                                         '{"0001-12-30 BC","0046-10-29 BC"}')
    assert rows_as_text(postgres, "ancient_stock", ["aa", "adt"])[1] == ("{{1,2},{3,NULL}}",
                                                                          "{0001-12-30,0046-10-29}")


def test_a_name_postgres_would_cut_and_a_date_into_timestamptz_are_refused_at_start(spark, postgres, jdbc, tmp_path):
    """A column name longer than 63 bytes: PostgreSQL cuts it in CREATE TABLE (Spark's JDBC writer then writes once
    and fails at the next write, the cut column "not defined in table"); a date into an existing timestamptz column:
    Spark's JDBC writer lands it at midnight in its JVM's default time zone, whatever spark.sql.session.timeZone
    says. Both are refused at start, naming the column and what to do; so is a createTableColumnTypes type the
    column's values cannot go into (before the table is created: Spark's JDBC writer creates it, then fails)."""
    url, properties = jdbc
    stream, static = the_input(spark, tmp_path / "in", tmp_path / "ck")
    long_name = "measured_" + "é" * 30  # 69 bytes, 39 characters
    got = error_of(lambda: start(stream.selectExpr("region", "offset", f"value AS `{long_name}`"), postgres,
                                 "cut_mine", tmp_path / "ck"))
    assert f"column {long_name!r} has a 69-byte name: PostgreSQL keeps only the first 63 bytes" in got, got[-1500:]
    assert "Rename it in your select(...)" in got, got[-1500:]
    # A createTableColumnTypes type the column's values cannot go into: stock creates the table, then fails.
    got = error_of(lambda: start(stream.selectExpr("region", "offset", "value AS v"), postgres, "misfit_mine",
                                 tmp_path / "ck", createTableColumnTypes="v INT"))
    assert "column 'v' (text) cannot take createTableColumnTypes' integer" in got, got[-1500:]
    with pytest.raises(Exception, match="Job aborted"):  # (PSQLException is not on Spark's own classpath)
        static.selectExpr("region", "offset", "value AS v").write.option("createTableColumnTypes", "v INT").jdbc(
            url, "misfit_stock", mode="append", properties=properties)
    with postgres.connect() as conn:
        assert conn.execute("SELECT to_regclass('cut_mine'), to_regclass('misfit_mine'), "
                            "to_regclass('misfit_stock') IS NOT NULL").fetchone() == (None, None, True)
        for table in ("zoned_mine", "zoned_stock"):
            conn.execute(f'CREATE TABLE {table} (region text, "offset" bigint, d timestamptz, n timestamp, '
                         "casted timestamptz)")
    select = ["region", "offset", "DATE'2024-06-01' AS d", "DATE'2024-06-01' AS n"]
    got = error_of(lambda: start(stream.selectExpr(*select), postgres, "zoned_mine", tmp_path / "ck"))
    assert "column 'd' is timestamp with time zone, the query writes date: Spark's JDBC writer would land" in got, \
        got[-1500:]
    assert "CAST(d AS TIMESTAMP) is midnight in the session time zone" in got, got[-1500:]
    jvm_zone = spark.sparkContext._jvm.java.util.TimeZone.getDefault().getID()
    session_zone = "Asia/Tokyo" if jvm_zone != "Asia/Tokyo" else "America/New_York"
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", session_zone)
    try:
        static.selectExpr(*select, "CAST(DATE'2024-06-01' AS TIMESTAMP) AS casted").limit(1).write.jdbc(
            url, "zoned_stock", mode="append", properties=properties)
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
    with postgres.connect() as conn:
        (jvm_midnight, session_midnight, casted, plain) = conn.execute(
            "SELECT d = timestamp '2024-06-01 00:00' AT TIME ZONE %s, "
            "d = timestamp '2024-06-01 00:00' AT TIME ZONE %s, "
            "casted = timestamp '2024-06-01 00:00' AT TIME ZONE %s, n::text FROM zoned_stock",
            (jvm_zone, session_zone, session_zone)).fetchone()
    assert (jvm_midnight, session_midnight, casted, plain) == (True, False, True, "2024-06-01 00:00:00")
