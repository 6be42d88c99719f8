"""target=postgres on a real PostgreSQL server: prepared transactions per region, real faults.

Every test checks the rows that landed, record by record: each input record exactly once, and each
region's rows in the table exactly the prefix of its input that the regional store says is committed
(so nothing past a gap was published), with no prepared transaction left behind.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest
from pyspark.sql import functions as F

import regional
from integration.helpers import (
    add_epoch_of_files,
    error_of,
    expected_rows,
    merge,
    regional_stream,
    run_killable,
    wait_for_epochs,
)

KILLING = "python:integration.faults:KillingPostgres"


def start_to_postgres(df, postgres, table: str, ck: Path, target: str = "postgres", **options: str):
    writer = (df.select("region", "offset", F.upper("value").alias("value")).writeStream.format("regional")
              .option("target", target).option("url", postgres.url).option("table", table)
              .option("keepRegionColumns", "true").option("checkpointLocation", str(ck)))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def pg_rows(postgres, table: str) -> list[tuple[str, int, str]]:
    with postgres.connect() as conn:
        return conn.execute(f'SELECT region, "offset", value FROM {table}').fetchall()


def prepared(postgres) -> list[str]:
    with postgres.connect() as conn:
        return [f"{g} (prepared at {t:%H:%M:%S.%f})" for g, t in conn.execute(
            "SELECT gid, prepared FROM pg_prepared_xacts")]


def assert_landed(postgres, table: str, expected: dict[str, list[str]], ck: Path, complete: bool = True,
                  others: frozenset[str] = frozenset(), interrupted: bool = False) -> None:
    """Each record at most once (exactly once when ``complete``), with its value; each region's rows are a
    prefix of its input (offsets 0..k-1: nothing past a gap), and hold at least what the store says is
    committed (a killed driver may have published an epoch it had not recorded yet). ``others``: regions
    of rows the test put into the table itself."""
    rows = [row for row in pg_rows(postgres, table) if row[0] not in others]
    seen: dict[tuple[str, int], int] = defaultdict(int)
    for region, offset, _ in rows:
        seen[(region, offset)] += 1
    doubled = sorted(k for k, n in seen.items() if n > 1)
    assert not doubled, f"published more than once: {doubled[:10]}"
    committed = {r: s.committed_offset for r, s in regional.status(ck).regions.items()}
    offsets: dict[str, set[int]] = defaultdict(set)
    for region, offset, value in rows:
        assert region in expected and 0 <= offset < len(expected[region]), f"unexpected row {region, offset}"
        assert value == expected[region][offset], f"wrong value at {region, offset}: {value!r}"
        offsets[region].add(offset)
    for region in expected:
        held = len(offsets[region])
        assert offsets[region] == set(range(held)), f"region {region} has a gap: {sorted(offsets[region])[:20]}"
        assert held >= committed.get(region, 0), f"region {region}: {held} rows, committed {committed.get(region)}"
        if complete:
            assert held == len(expected[region]) == committed.get(region), (region, held, committed)
        elif not interrupted:
            assert held == committed.get(region, 0), (region, held, committed)
    if not interrupted:
        assert prepared(postgres) == []


def test_regions_the_database_rejects_fall_back_while_the_others_publish_then_catch_up(spark, postgres, dirs):
    """c's rows fire a trigger that raises while c is in the reject list; d's rows break a unique constraint
    while a conflicting row exists. A primary key on (region, offset) would catch any row written twice."""
    inp, _out, ck = dirs
    inputs = add_epoch_of_files(inp, ["a", "b", "c", "d"], "001", 12)
    with postgres.connect() as conn:
        conn.execute("""
            CREATE TABLE rejecting (region text, "offset" bigint, value text UNIQUE, PRIMARY KEY (region, "offset"));
            CREATE TABLE reject (region text);
            INSERT INTO reject VALUES ('c');
            CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF EXISTS (SELECT 1 FROM reject WHERE region = NEW.region) THEN
                RAISE EXCEPTION 'region % is refused by a trigger', NEW.region;
              END IF;
              RETURN NEW;
            END $$;
            CREATE TRIGGER refuse BEFORE INSERT ON rejecting FOR EACH ROW EXECUTE FUNCTION refuse();
            CREATE TABLE keep (region text, "offset" bigint, value text);
            INSERT INTO rejecting VALUES ('elsewhere', 0, 'D-001-5');
        """)
    query = start_to_postgres(regional_stream(spark, inp, ck, maxRecordsPerRegion="4"), postgres, "rejecting", ck)
    try:
        wait_for_epochs(query, ck, 3)
        st = regional.status(ck)
        assert st.regions["a"].committed_offset == st.regions["b"].committed_offset == 12
        assert st.regions["c"].committed_offset == 0 and st.regions["c"].state == "fallen_back"
        assert "refused by a trigger" in st.regions["c"].reason
        assert st.regions["d"].committed_offset == 4 and "duplicate key" in st.regions["d"].reason
        assert_landed(postgres, "rejecting", expected_rows(inputs), ck, complete=False, others=frozenset({"elsewhere"}))
        assert any(e.kind == "regional" and set(e.committed) == {"a", "b"} for e in st.epochs)
        with postgres.connect() as conn:  # the database is mended
            conn.execute("DELETE FROM reject; DELETE FROM rejecting WHERE region = 'elsewhere'")
        query.processAllAvailable()
    finally:
        query.stop()
    assert_landed(postgres, "rejecting", expected_rows(inputs), ck)
    assert regional.status(ck).regions["c"].state == "ok"


# CI kills between two COMMIT PREPARED (what only PostgreSQL leaves behind: prepared transactions; a kill in a
# task after its PREPARE is test_a_python_worker_killed_...); the campaign (REGIONAL_CAMPAIGN=1) kills at all
# four steps, and reliability.run kills at random moments.
@pytest.mark.parametrize("steps", [("between_commits",),
                                   pytest.param(("staged", "before_publish", "between_commits", "before_record"),
                                                marks=pytest.mark.campaign)])
def test_sigkill_of_the_driver_at_each_step_of_phase_two_then_a_restart(postgres, tmp_path, steps):
    """One query killed at each step, at a later epoch each time: in a task after its PREPARE, after the decision,
    between two regions' COMMIT PREPARED, after publishing but before recording; each restart finishes the
    interrupted epoch as decided (or re-runs it), and rolls back what the dead run left prepared. The primary
    key makes a re-run's COPY wait for any prepared transaction of the same rows: an interrupted epoch must be
    finished before the re-run's tasks start, or they wait for ever."""
    inp, ck, marker = tmp_path / "in", tmp_path / "ck", tmp_path / "reached"
    inputs = add_epoch_of_files(inp, ["a", "b", "c"], "001", 40)
    table = f"crashes_{len(steps)}"
    with postgres.connect() as conn:
        conn.execute(f'CREATE TABLE {table} (region text, "offset" bigint, value text, PRIMARY KEY (region, "offset"))')
    args = ["integration.postgres_child", str(inp), str(ck), postgres.url, table]
    for epoch, step in enumerate(steps, start=1):
        assert run_killable(args, f"{step}:{epoch}", marker, timeout=150) == "killed", step
        left = prepared(postgres)
        assert (len(left) == 3) if step == "before_publish" else (len(left) == 2) if step == "between_commits" \
            else (len(left) <= 3) if step == "staged" else not left, (step, left)
        assert_landed(postgres, table, expected_rows(inputs), ck, complete=False, interrupted=True)
    assert run_killable(args, None, marker) == "finished"
    assert_landed(postgres, table, expected_rows(inputs), ck)
    assert [e.epoch for e in regional.status(ck).epochs] == list(range(len(regional.status(ck).epochs)))


def test_a_python_worker_killed_mid_copy_and_after_prepare_leaves_no_prepared_transaction(spark, postgres, dirs):
    """Spark retries the killed task; the retry rolls back the dead attempt's prepared transaction first (its
    locks on the primary key would block the retry's COPY: lockTimeout makes that the region's failure)."""
    inp, out, ck = dirs
    inputs = add_epoch_of_files(inp, ["a", "b", "c"], "001", 9)
    with postgres.connect() as conn:
        conn.execute('CREATE TABLE killed (region text, "offset" bigint, value text, PRIMARY KEY (region, "offset"))')
    # four attempts per region (local[4,4] allows them): the retries write, rather than being quarantined
    query = start_to_postgres(regional_stream(spark, inp, ck, maxRecordsPerRegion="3", regionAttempts="4"),
                              postgres, "killed", ck, target=KILLING, killRegion="b", faultDir=str(out.parent),
                              regionAttempts="4", lockTimeout="20s")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert (out.parent / "mid-copy").exists() and (out.parent / "after-prepare").exists()
    # b's retries never waited for the locks of a dead attempt (lock_timeout would have failed them)
    epochs = regional.status(ck).epochs
    assert {e.kind for e in epochs} == {"global"}, [(e.epoch, e.kind, e.fallen_back) for e in epochs]
    assert_landed(postgres, "killed", expected_rows(inputs), ck)


def test_the_database_restarted_mid_run_loses_and_doubles_nothing(spark, postgres, dirs):
    inp, _out, ck = dirs
    inputs = add_epoch_of_files(inp, ["a", "b", "c", "d"], "001", 40)
    query = start_to_postgres(regional_stream(spark, inp, ck, maxRecordsPerRegion="2"), postgres, "restarted", ck)
    try:
        wait_for_epochs(query, ck, 3)
        postgres.restart()
        more = add_epoch_of_files(inp, ["a", "b", "c", "d"], "002", 5)
        query.processAllAvailable()
    finally:
        query.stop()
    assert_landed(postgres, "restarted", expected_rows(merge(inputs, more)), ck)


def test_spark_types_become_postgres_columns_and_values_survive(spark, postgres, dirs):
    inp, _out, ck = dirs
    add_epoch_of_files(inp, ["a"], "001", 3)
    df = regional_stream(spark, inp, ck).selectExpr(
        "region", "offset",
        "CASE offset WHEN 0 THEN 'x\"y,z\nw' WHEN 1 THEN '' ELSE NULL END AS text",
        "CAST(offset AS TINYINT) AS tiny", "CAST(offset AS INT) AS i", "offset * 10000000000 AS big",
        "CAST(offset / 2 AS FLOAT) AS f", "CASE offset WHEN 2 THEN double('NaN') ELSE offset / 3 END AS d",
        "CAST(offset AS DECIMAL(10, 2)) + 0.25 AS dec", "offset = 1 AS flag",
        "date_add(DATE'2024-02-29', CAST(offset AS INT)) AS day",
        "TIMESTAMP'2024-01-01 12:34:56.789' + make_interval(0, 0, 0, 0, offset) AS ts",
        "CAST('2024-01-01 00:00:00.5' AS TIMESTAMP_NTZ) AS ntz", "CAST(value AS BINARY) AS raw",
        "array(offset, offset + 1) AS arr", "map('k', value) AS m", "named_struct('n', offset, 's', value) AS st")
    query = (df.writeStream.format("regional").option("target", "postgres").option("url", postgres.url)
             .option("table", "public.typed").option("keepRegionColumns", "true")
             .option("checkpointLocation", str(ck)).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    with postgres.connect() as conn:
        columns = dict(conn.execute("SELECT column_name, data_type FROM information_schema.columns "
                                    "WHERE table_name = 'typed'").fetchall())
        rows = conn.execute('SELECT text, tiny, i, big, f, d, dec, flag, day::text, ts, ntz::text, raw, arr, m, st '
                            'FROM typed ORDER BY "offset"').fetchall()
    assert columns == {"region": "text", "offset": "bigint", "text": "text", "tiny": "smallint", "i": "integer",
                       "big": "bigint", "f": "real", "d": "double precision", "dec": "numeric", "flag": "boolean",
                       "day": "date", "ts": "timestamp with time zone", "ntz": "timestamp without time zone",
                       "raw": "bytea", "arr": "jsonb", "m": "jsonb", "st": "jsonb"}
    assert [r[0] for r in rows] == ['x"y,z\nw', "", None]
    assert [r[1:4] for r in rows] == [(0, 0, 0), (1, 1, 10000000000), (2, 2, 20000000000)]
    assert [r[4] for r in rows] == [0.0, 0.5, 1.0] and rows[1][5] == pytest.approx(1 / 3) and rows[2][5] != rows[2][5]
    assert [str(r[6]) for r in rows] == ["0.25", "1.25", "2.25"] and [r[7] for r in rows] == [False, True, False]
    assert [r[8] for r in rows] == ["2024-02-29", "2024-03-01", "2024-03-02"]
    assert rows[1][9].isoformat() == "2024-01-01T13:34:56.789000+00:00"  # the session time zone is UTC
    assert rows[0][10] == "2024-01-01 00:00:00.5"
    assert [bytes(r[11]) for r in rows] == [b"a-001-0", b"a-001-1", b"a-001-2"]
    assert rows[2][12:] == ([2, 3], {"k": "a-001-2"}, {"n": 2, "s": "a-001-2"})


def test_bad_postgres_options_and_servers_are_refused_at_start(spark, postgres, dirs, tmp_path):
    from regional.testing.postgres_server import PostgresServer

    inp, _out, ck = dirs
    add_epoch_of_files(inp, ["a"], "001", 3)
    with postgres.connect() as conn:
        conn.execute('CREATE TABLE misfit (region text, "offset" text, value text, needed int NOT NULL)')
    df = regional_stream(spark, inp, ck)
    message = error_of(lambda: start_to_postgres(df, postgres, "misfit", ck))
    assert re.search(r"table misfit does not fit the query: column 'offset' is text, the query writes bigint; "
                     r"column 'needed' is NOT NULL without a default", message), message[-2000:]
    secret = postgres.url.replace("postgres@", "postgres:hunter2@")
    message = error_of(lambda: df.select("region", "offset", "value").writeStream.format("regional")
                       .option("target", "postgres").option("url", secret).option("table", "t")
                       .option("checkpointLocation", str(ck)).start())
    assert "holds a password" in message and "PGPASSWORD" in message
    no_2pc = PostgresServer(max_prepared_transactions=0).start()
    try:
        message = error_of(lambda: start_to_postgres(df, no_2pc, "t", ck))
        assert "max_prepared_transactions = 0" in message, message[-2000:]
    finally:
        no_2pc.remove()
    with postgres.connect() as conn:
        assert conn.execute("SELECT to_regclass('t')").fetchone() == (None,)
    assert prepared(postgres) == []


def test_table_names_are_quoted_never_spliced(spark, postgres, dirs):
    inp, _out, ck = dirs
    inputs = add_epoch_of_files(inp, ["a", "b"], "001", 3)
    with postgres.connect() as conn:
        conn.execute('CREATE SCHEMA "we.ird"')
    query = start_to_postgres(regional_stream(spark, inp, ck), postgres, '"we.ird"."x; DROP TABLE y"', ck)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert_landed(postgres, '"we.ird"."x; DROP TABLE y"', expected_rows(inputs), ck)
    with postgres.connect() as conn:
        assert conn.execute("SELECT to_regclass('\"we.ird\".regional_commits')").fetchone() != (None,)

