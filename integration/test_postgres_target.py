"""target=postgres on a real PostgreSQL server: prepared transactions per region, real faults.

Every test checks the rows that landed, record by record: each input record exactly once, and each
region's rows in the table exactly the prefix of its input that the regional store says is committed
(so nothing past a gap was published), with no prepared transaction left behind.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
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
from regional.store import Store
from regional.targets.base import RowsRejected
from regional.targets.postgres import PostgresTarget, region_key

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


@pytest.mark.smoke
def test_regions_the_database_rejects_fall_back_while_the_others_publish_then_catch_up(spark, postgres, dirs):
    """c's rows fire a trigger that raises while c is in the reject list (P0001: about the rows, perhaps not for their
    own sake, so c is quarantined, as for a UDF's unknown exception: before issue 55 c fell back as the target failing,
    for ever with dead letters on); d's rows break a unique constraint while a conflicting row exists (23505: the
    rows' failure, d is quarantined).
    A primary key on (region, offset) would catch any row written twice."""
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
        assert st.regions["c"].committed_offset == 0 and st.regions["c"].state == "quarantined"
        assert "refused by a trigger" in st.regions["c"].reason
        # a row the table refuses (a unique key, SQLSTATE 23505) is the rows' failure: quarantined, as a poison record
        assert st.regions["d"].committed_offset == 4 and st.regions["d"].state == "quarantined"
        assert "duplicate key value violates unique constraint" in st.regions["d"].reason, st.regions["d"].reason
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
# About 75 s idle (147 s beside another worker), two child drivers: the kill, then a run that ends its script
# without stopping its query (test_a_script_that_ends_without_stopping_exits_cleanly's claim, merged here).
@pytest.mark.parametrize("steps", [pytest.param(("between_commits",), marks=pytest.mark.smoke),
                                   pytest.param(("staged", "before_publish", "between_commits", "before_record"),
                                                marks=pytest.mark.campaign)])
def test_sigkill_of_the_driver_at_each_step_of_phase_two_then_a_restart(postgres, tmp_path, steps):
    """One query killed at each step, at a later epoch each time: in a task after its PREPARE, after the decision,
    between two regions' COMMIT PREPARED, after publishing but before recording; each restart finishes the
    interrupted epoch as decided (or re-runs it), and rolls back what the dead run left prepared. The primary
    key makes a re-run's COPY wait for any prepared transaction of the same rows: an interrupted epoch must be
    finished before the re-run's tasks start, or they wait for ever. The last run is a script that ends without
    stopping its query or Spark: it exits at once, with no py4j stack trace printed at exit (what
    test_a_script_that_ends_without_stopping_exits_cleanly, merged here, checked in a child driver of its own)."""
    import subprocess
    import sys

    from integration.helpers import ROOT

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
    try:  # one stream, stdout and stderr: what comes after the end of the script
        last = subprocess.run([sys.executable, "-m", *args, "--end-without-stopping"], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240)
    except subprocess.TimeoutExpired as hung:
        printed = hung.output.decode(errors="replace") if isinstance(hung.output, bytes) else hung.output or ""
        raise AssertionError(f"the last run did not end in 240 s:\n{printed[-4000:]}") from None
    output = last.stdout
    assert last.returncode == 0 and "child finished" in output, output[-3000:]
    after = output.split("child finished", 1)[1]  # not one daemon BrokenPipeError either
    for noise in ("Traceback", "Py4J", "py4j", "Connection refused", "Exception"):
        assert noise not in after, f"{noise!r} printed at exit:\n{after[-3000:]}"
    assert_landed(postgres, table, expected_rows(inputs), ck)
    epochs = [e.epoch for e in regional.status(ck).epochs]
    assert epochs == list(range(len(epochs))), epochs


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
                       "raw": "bytea", "arr": "ARRAY", "m": "jsonb", "st": "jsonb"}
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



# -- leftovers of other queries, and attempts that overlap (issue 26, item 6) -----------------------------


def other_query(postgres, table: str, checkpoint: Path, **options: str) -> PostgresTarget:
    """The target as another query's driver and tasks build it: its own query id and checkpoint."""
    return PostgresTarget({"url": postgres.url, "table": table, "queryid": str(uuid.uuid4()),
                           "checkpointlocation": str(checkpoint), **options})


def slice_of(region: str, offsets: range) -> Iterator[pa.RecordBatch]:
    yield pa.record_batch({"region": [region] * len(offsets), "offset": list(offsets),
                           "value": [f"{region.upper()}-{i}" for i in offsets]})


SLICE = pa.schema([("region", pa.string()), ("offset", pa.int64()), ("value", pa.string())])


@pytest.mark.campaign  # 45 s idle, keeping CI within its time
def test_a_killed_run_of_a_wiped_checkpoint_leaves_nothing_that_blocks_the_next_query(spark, postgres, tmp_path):
    """A child driver is SIGKILLed after deciding epoch 0 and before publishing it: its three regions' prepared
    transactions hold the primary key's locks on their rows. The checkpoint is wiped and the same query
    started again on the same path (a new query id): its first epoch's tasks would wait for those locks
    (lockTimeout) epoch after epoch, its regions falling back for ever. Its start must roll them back (and say
    so), publish every record once, and leave alone a live query's prepared work on the same table."""
    inp, ck, marker = tmp_path / "in", tmp_path / "ck", tmp_path / "reached"
    inputs = add_epoch_of_files(inp, ["a", "b", "c"], "001", 20)
    with postgres.connect() as conn:
        conn.execute('CREATE TABLE wiped (region text, "offset" bigint, value text, PRIMARY KEY (region, "offset"))')
    args = ["integration.postgres_child", str(inp), str(ck), postgres.url, "wiped"]
    assert run_killable(args, "before_publish:0", marker, timeout=150) == "killed"
    dead = prepared(postgres)
    assert len(dead) == 3, dead
    dead_query = Store(ck).query_id()
    # Another query writing the same table, alive: its epoch 0 is prepared and not yet committed.
    live = other_query(postgres, "wiped", tmp_path / "live-ck")
    live.open(SLICE)
    live_handle = live.prepare(0, "live", slice_of("live", range(3)))
    shutil.rmtree(ck)
    query = start_to_postgres(regional_stream(spark, inp, ck), postgres, "wiped", ck, lockTimeout="5s")
    try:
        wait_for_epochs(query, ck, 1)  # epoch 0 plans every record
    finally:
        query.stop()
    status = regional.status(ck)
    assert Store(ck).query_id() != dead_query
    left = prepared(postgres)
    assert [g for g in left if dead_query in g] == [], left  # the dead query's leftovers are gone
    assert [g.split(" ")[0] for g in left] == [live_handle["gid"]], left  # the live query's work is kept
    first = status.epochs[0]
    assert (first.epoch, first.kind, sorted(first.fallen_back)) == (0, "global", []), status.epochs
    live.commit(0, {"live": live_handle})  # its driver publishes it
    assert_landed(postgres, "wiped", expected_rows(inputs), ck, others=frozenset({"live"}))
    assert sorted(r for r in pg_rows(postgres, "wiped") if r[0] == "live") == [
        ("live", 0, "LIVE-0"), ("live", 1, "LIVE-1"), ("live", 2, "LIVE-2")]


def test_other_queries_leftovers_go_only_when_that_query_cannot_commit_them_and_are_reported(
        postgres, tmp_path, caplog):
    """Prepared transactions of other query ids on one table, made as their targets make them (and one as the
    version before gids named their table made it): ``open`` rolls back those of a query that has since
    committed a later epoch, and those of a query silent for longer than orphanTimeout, each with a warning
    naming the query and how many; it keeps a live query's, an idle query's whose epoch is partly published
    (the rest may be its to commit after a restart), and anything on other tables, and says what it kept."""
    table = "leftovers"
    with postgres.connect() as conn:
        conn.execute(f'CREATE TABLE {table} (region text, "offset" bigint, value text); '
                     'CREATE TABLE elsewhere (region text, "offset" bigint, value text)')
    moved_on = other_query(postgres, table, tmp_path / "ck1")
    moved_on.open(SLICE)
    stale = moved_on.prepare(2, "a", slice_of("a", range(0, 2)))  # an attempt its driver did not choose
    moved_on.commit(3, {"a": moved_on.prepare(3, "a", slice_of("a", range(2, 4)))})  # then it went on
    partly = other_query(postgres, table, tmp_path / "ck2")
    partly.open(SLICE)
    partly_b = partly.prepare(5, "b", slice_of("b", range(0, 2)))
    partly.commit(5, {"b": partly_b})
    partly_left = partly.prepare(5, "c", slice_of("c", range(0, 2)))  # killed between two COMMIT PREPARED
    old_query = str(uuid.uuid4())
    old_gid = f"regional:{old_query}:7:{region_key('d')}:0123456789ab"  # an earlier version's gid: no table
    conn = psycopg.connect(postgres.url)  # as that version's prepare did it
    conn.tpc_begin(old_gid)
    with conn.cursor() as cur:
        with cur.copy(f'COPY {table} (region, "offset", value) FROM STDIN (FORMAT csv)') as copy:
            copy.write('"d",0,"D-0"\n')
        cur.execute("INSERT INTO regional_commits (query_id, region, epoch, gid, row_count) VALUES (%s, 'd', 7, %s, 1)",
                    (old_query, old_gid))
    conn.tpc_prepare()
    conn.close()
    elsewhere = other_query(postgres, "elsewhere", tmp_path / "ck3")
    elsewhere.open(SLICE)
    other_table = elsewhere.prepare(1, "e", slice_of("e", range(0, 2)))
    me = other_query(postgres, table, tmp_path / "ck4")

    caplog.set_level(logging.WARNING, logger="regional")
    me.open(SLICE)
    left = {g.split(" ")[0] for g in prepared(postgres)}
    assert stale["gid"] not in left, "a query that committed a later epoch never commits an earlier one"
    assert {partly_left["gid"], old_gid, other_table["gid"]} <= left
    assert f"rolled back 1 prepared transaction(s) that query {moved_on.query_id} left on table leftovers" \
        in caplog.text, caplog.text
    assert f"prepared transaction(s) of query {old_query}" in caplog.text and "ROLLBACK PREPARED" in caplog.text

    caplog.clear()
    impatient = PostgresTarget({**me.options, "orphantimeout": "0s"})
    impatient.open(SLICE)
    left = {g.split(" ")[0] for g in prepared(postgres)}
    assert old_gid not in left, "an idle query's leftover (found through pg_locks: its gid names no table)"
    assert partly_left["gid"] in left and other_table["gid"] in left
    assert f"rolled back 1 prepared transaction(s) that query {old_query} left on table leftovers" in caplog.text
    assert f"1 prepared transaction(s) of query {partly.query_id}" in caplog.text
    with postgres.connect() as conn:
        assert sorted(conn.execute(f'SELECT region, "offset" FROM {table}').fetchall()) == [
            ("a", 2), ("a", 3), ("b", 0), ("b", 1)]
    partly.commit(5, {"b": partly_b, "c": partly_left})  # its restart finishes the epoch as decided
    elsewhere.abort(1, {"e": other_table})
    assert prepared(postgres) == []
    with postgres.connect() as conn:
        assert sorted(conn.execute(f'SELECT region, "offset" FROM {table}').fetchall()) == [
            ("a", 2), ("a", 3), ("b", 0), ("b", 1), ("c", 0), ("c", 1)]


@pytest.mark.parametrize("twin", ["zombie", "speculative"])
def test_two_attempts_of_a_region_both_prepare_only_the_chosen_one_commits(spark, postgres, dirs, twin):
    """Region b's task stages its slice twice in epochs 0 and 1, as two attempts of one task would: a zombie
    (an earlier attempt on an executor Spark lost, preparing after the chosen one) or a speculative copy. The
    other attempt must not roll back the chosen one's prepared transaction (the driver would then fail to
    commit it, at every restart); the driver commits the chosen one and rolls the other back. A zombie that
    prepares after its epoch was recorded is swept at the next epoch's start."""
    inp, out, ck = dirs
    out.mkdir(parents=True)
    inputs = add_epoch_of_files(inp, ["a", "b", "c"], "001", 6)
    table = f"twins_{twin}"
    with postgres.connect() as conn:
        conn.execute(f'CREATE TABLE {table} (region text, "offset" bigint, value text)')
    query = start_to_postgres(regional_stream(spark, inp, ck, maxRecordsPerRegion="3"), postgres, table, ck,
                              target="python:integration.faults:TwinAttemptPostgres", twinRegion="b",
                              twinEpochs="0,1", twin=twin, faultDir=str(out))
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    twins = [json.loads(line) for line in (out / "twins").read_text().splitlines()]
    assert [t["epoch"] for t in twins] == [0, 1], twins
    assert prepared(postgres) == []  # the twins were rolled back
    assert {e.kind for e in regional.status(ck).epochs} == {"global"}
    assert_landed(postgres, table, expected_rows(inputs), ck)
    # A zombie of epoch 0 that prepares after the epoch was recorded (no Spark task: it names no run).
    late = PostgresTarget({"url": postgres.url, "table": table, "queryid": Store(ck).query_id(),
                           "checkpointlocation": str(ck)})
    late.prepare(0, "b", slice_of("b", range(0, 3)))
    more = add_epoch_of_files(inp, ["a", "b", "c"], "002", 2)
    query = start_to_postgres(regional_stream(spark, inp, ck, maxRecordsPerRegion="3"), postgres, table, ck)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert_landed(postgres, table, expected_rows(merge(inputs, more)), ck)


@pytest.mark.campaign  # 60 s idle, keeping CI within its time (it keeps test_postgres_like_jdbc's)
def test_rows_postgres_refuses_are_the_rows_failure_and_a_lock_timeout_is_not(postgres, tmp_path):
    """A CHECK constraint, a NOT NULL column and a value out of a column's range (SQLSTATE classes 23 and 22) raise
    RowsRejected from prepare, after the attempt's transaction is rolled back: nothing stays prepared or locked. A
    row lock held elsewhere (lock_timeout, class 55) is the target's failure: not RowsRejected."""
    with postgres.connect() as conn:
        conn.execute('CREATE TABLE refusing (region text, "offset" bigint PRIMARY KEY, value text CHECK (value <> '
                     "'bad'), small smallint NOT NULL)")
    target = other_query(postgres, "refusing", tmp_path / "ck", lockTimeout="200ms")
    schema = pa.schema([("region", pa.string()), ("offset", pa.int64()), ("value", pa.string()),
                        ("small", pa.int64())])
    target.open(schema)

    def batch(offset: int, value: str, small: int | None) -> Iterator[pa.RecordBatch]:
        yield pa.record_batch([["a"], [offset], [value], [small]], schema=schema)

    for offset, value, small, state in [(1, "bad", 1, "23514"), (2, "ok", None, "23502"), (3, "ok", 40000, "22003")]:
        with pytest.raises(RowsRejected, match=f"table refusing refused the rows \\(SQLSTATE {state}\\)"):
            target.prepare(0, "a", batch(offset, value, small))
    assert prepared(postgres) == []
    holder = psycopg.connect(postgres.url)
    try:
        holder.execute('INSERT INTO refusing VALUES (\'a\', 4, \'ok\', 1)')  # uncommitted: holds key 4
        with pytest.raises(psycopg.errors.LockNotAvailable):
            target.prepare(0, "a", batch(4, "ok", 1))
    finally:
        holder.close()
    assert prepared(postgres) == []
    handle = target.prepare(0, "a", batch(4, "ok", 1))  # the lock is gone: the same row lands
    target.commit(0, {"a": handle})
    assert pg_rows(postgres, "refusing") == [("a", 4, "ok")]


def test_a_probe_checks_rows_as_the_table_would_and_keeps_nothing(postgres, tmp_path):
    """A probe's rows (records beside an isolated one) include rows the table holds already: the primary key must not
    refuse those (the probe would fail for ever, and the isolated record never be dead-lettered). Each row the table
    itself would refuse is refused as prepare refuses it; nothing stays in the table, prepared, or locked."""
    with postgres.connect() as conn:
        conn.execute('CREATE TABLE probed (region text, "offset" bigint PRIMARY KEY, value text CHECK (value <> '
                     "'bad'), small smallint NOT NULL)")
    target = other_query(postgres, "probed", tmp_path / "ck")
    schema = pa.schema([("region", pa.string()), ("offset", pa.int64()), ("value", pa.string()),
                        ("small", pa.int64())])
    target.open(schema)

    def rows(*values: tuple[int, str, int | None]) -> Iterator[pa.RecordBatch]:
        yield pa.record_batch([["a"] * len(values), [v[0] for v in values], [v[1] for v in values],
                               [v[2] for v in values]], schema=schema)

    target.commit(0, {"a": target.prepare(0, "a", rows((1, "one", 1), (2, "two", 2)))})
    with pytest.raises(RowsRejected, match="SQLSTATE 23505"):  # what the old probe, a prepare, met
        target.prepare(1, "a", rows((1, "one", 1), (2, "two", 2)))
    assert target.probe(1, "a", rows((1, "one", 1), (2, "two", 2))) is None
    for values, state in [([(3, "bad", 1)], "23514"), ([(3, "ok", None)], "23502"), ([(3, "ok", 40000)], "22003"),
                          ([(3, "ok", 1), (3, "again", 1)], "23505")]:
        with pytest.raises(RowsRejected, match=f"table probed refused the rows \\(SQLSTATE {state}\\)"):
            target.probe(1, "a", rows(*values))
    assert pg_rows(postgres, "probed") == [("a", 1, "one"), ("a", 2, "two")] and prepared(postgres) == []
    with postgres.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'regional_probe%'").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                            "WHERE c.relname = 'probed'").fetchone() == (0,)
