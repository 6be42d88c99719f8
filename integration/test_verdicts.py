"""The user's and the target's verdict on real Spark and Delta (issue 55): with ``deadLetterOn`` naming the poison's
class, poison is dead-lettered as soon as it stands alone, with the shipped retries (4, a minute apart) never waited
on; a UDF raising ``regional.Outage`` is never dead-lettered; a row PostgreSQL refuses for its own sake (a CHECK
constraint) is dead-lettered without outage evidence, and a trigger's refusal is isolated, not the target failing."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import regional
from integration.helpers import add_epoch_of_files, assert_exactly_once, regional_stream
from integration.test_dead_letters import dead_letter_rows, expected_without, start
from regional.store.model import describe
from regional.targets.base import RowsInvalid, RowsRejected
from regional.targets.postgres import PostgresTarget

SHIPPED = {"deadLetterRetries": "4", "deadLetterRetryBackoff": "1m"}  # the shared session sets retries 0


def run_until(query, ck: Path, finished, timeout: float, start_timeout: float = 180) -> float:
    """Seconds from the first epoch recorded until ``finished(status)``; fails after ``timeout`` (the query keeps
    running until stopped)."""
    began = time.monotonic()
    while not regional.status(ck).epochs:
        if query.exception() is not None or not query.isActive:
            raise AssertionError(f"query ended early: {query.exception()}")
        if time.monotonic() - began > start_timeout:
            raise AssertionError(f"no epoch recorded after {start_timeout:.0f} s")
        time.sleep(0.3)
    began = time.monotonic()
    while True:
        if query.exception() is not None or not query.isActive:
            raise AssertionError(f"query ended early: {query.exception()}")
        st = regional.status(ck)
        if finished(st):
            return time.monotonic() - began
        if time.monotonic() - began > timeout:
            raise AssertionError(f"not done after {timeout:.0f} s: "
                                 + "; ".join(describe(e) for e in st.epochs[-6:]))
        time.sleep(0.3)


@pytest.mark.smoke
def test_dead_letter_on_dead_letters_poison_on_its_first_failure_alone(spark, dirs, tmp_path):
    """a's first record is malformed (no neighbour before it: issue 55's first situation), and b's third; with the
    shipped deadLetterRetries=4 and backoff 1m the evidence rule took minutes per record. deadLetterOn=ValueError:
    each is dead-lettered in the epoch it first stands alone and fails, never retried; every other record is
    published once."""
    inp, out, ck = dirs
    dlq = tmp_path / "dead-letters"
    inputs = {**add_epoch_of_files(inp, ["a"], "001", 2), **add_epoch_of_files(inp, ["b", "c"], "001", 4)}
    poison = {("a", 0), ("b", 2)}
    bad = {inputs[r][o] for r, o in poison}

    @F.udf("string")
    def parse(value: str) -> str:
        if value in bad:
            raise ValueError(f"cannot parse {value}")
        return value.upper()

    df = regional_stream(spark, inp, ck)
    query = start(df.select("region", "offset", parse("value").alias("value")), out, ck, deadLetterPath=str(dlq),
                  deadLetterOn="ValueError", **SHIPPED)
    sizes = {"a": 2, "b": 4, "c": 4}
    try:
        took = run_until(query, ck, lambda st: all(r in st.regions and st.regions[r].committed_offset == n
                                                   for r, n in sizes.items()), timeout=240)
    finally:
        query.stop()
    assert_exactly_once(out, expected_without(inputs, poison), spark)
    letters = dead_letter_rows(dlq)
    assert [(r["region"], r["offset"], r["value"], r["error"]) for r in letters] == sorted(
        (r, o, inputs[r][o], f"ValueError: cannot parse {inputs[r][o]}") for r, o in poison)
    st = regional.status(ck)
    # never a failure alone that waited: each was dead-lettered on its first (before: waits of a minute each)
    waited = [(e.epoch, r, f.reason) for e in st.epochs for r, f in e.fallen_back.items()
              if "alone" in (f.reason or "")]
    assert waited == [], waited
    assert sum(s.dead_letters for s in st.regions.values()) == 2
    print(f"\n2 poison records dead-lettered in {took:.1f} s, {len(st.epochs)} epochs")


def test_a_udf_raising_regional_outage_is_never_dead_lettered(spark, dirs, tmp_path):
    """a-001-1 raises regional.Outage while a flag file exists; its neighbours pass beside it epoch after epoch
    (the evidence that, with deadLetterRetries=0, dead-letters a record raising anything else). It waits with
    back-off, its reason says why; once the flag goes, it is published once."""
    inp, out, ck = dirs
    dlq, flag = tmp_path / "dead-letters", tmp_path / "down"
    flag.touch()
    inputs = add_epoch_of_files(inp, ["a"], "001", 3)
    suspect, down = inputs["a"][1], str(flag)

    @F.udf("string")
    def call(value: str) -> str:
        if value == suspect and os.path.exists(down):
            raise regional.Outage(f"the service {value} needs is down")
        return value.upper()

    df = regional_stream(spark, inp, ck)
    query = start(df.select("region", "offset", call("value").alias("value")), out, ck, deadLetterPath=str(dlq),
                  deadLetterRetries="0", deadLetterRetryBackoff="0")

    def waited(st) -> bool:
        a = st.regions.get("a")
        return a is not None and a.alone_waits >= 2 and a.probe_passed is not None

    try:
        run_until(query, ck, waited, timeout=240)
        a = regional.status(ck).regions["a"]
        assert a.committed_offset == 1 and a.dead_letters == 0 and a.alone_since is None
        assert "regional.errors.Outage, raised to say so: an outage, never dead-lettered" in a.reason, a.reason
        flag.unlink()
        run_until(query, ck, lambda st: st.regions["a"].committed_offset == 3, timeout=240)
    finally:
        query.stop()
    assert_exactly_once(out, expected_without(inputs, set()), spark)
    assert dead_letter_rows(dlq) == []


# -- PostgreSQL: the target's verdict ------------------------------------------------------------------------


def test_postgres_tells_rows_refused_for_their_own_sake_from_rows_refused_otherwise(postgres, tmp_path):
    """A CHECK constraint, a NOT NULL column and a value out of range: RowsInvalid (dead-lettered as soon as
    isolated). A row no partition takes, a trigger's RAISE (P0001, before: the target failing, its region falling
    back for ever), an index row too large (54000): RowsRejected (isolated, dead-lettered
    on evidence). Nothing stays prepared. The probe checks its rows against the table's trigger too (before, a
    temporary copy without triggers passed them while the table refused every row), and skips rows it holds."""
    with postgres.connect() as conn:
        conn.execute("""
            CREATE TABLE verdicts (region text, "offset" bigint PRIMARY KEY, value text CHECK (value <> 'bad'),
                                   small smallint NOT NULL);
            CREATE INDEX verdicts_value ON verdicts (value);
            CREATE FUNCTION verdicts_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF NEW.value = 'refused' OR EXISTS (SELECT 1 FROM verdicts_off) THEN
                RAISE EXCEPTION 'value % is refused by a trigger', NEW.value;
              END IF;
              RETURN NEW;
            END $$;
            CREATE TABLE verdicts_off (x int);
            CREATE TRIGGER verdicts_refuse BEFORE INSERT ON verdicts FOR EACH ROW EXECUTE FUNCTION verdicts_refuse();
            CREATE TABLE parted (region text, "offset" bigint, value text, small smallint) PARTITION BY LIST (region);
            CREATE TABLE parted_a PARTITION OF parted FOR VALUES IN ('a');
        """)
    schema = pa.schema([("region", pa.string()), ("offset", pa.int64()), ("value", pa.string()),
                        ("small", pa.int64())])

    def target(table: str) -> PostgresTarget:
        t = PostgresTarget({"url": postgres.url, "table": table, "queryid": str(uuid.uuid4()),
                            "checkpointlocation": str(tmp_path / table)})
        t.open(schema)
        return t

    def rows(*values: tuple[str, int, str, int | None]) -> Iterator[pa.RecordBatch]:
        yield pa.record_batch([list(col) for col in zip(*values, strict=True)], schema=schema)

    verdicts, parted = target("verdicts"), target("parted")
    for row, state in [(("a", 1, "bad", 1), "23514"), (("a", 2, "ok", None), "23502"),
                       (("a", 3, "ok", 40000), "22003")]:
        with pytest.raises(RowsInvalid, match=f"SQLSTATE {state}"):
            verdicts.prepare(0, "a", rows(row))
    too_large = os.urandom(8000).hex()  # incompressible: too large for a btree index row
    for t, row, state in [(verdicts, ("a", 4, "refused", 1), "P0001"), (verdicts, ("a", 5, too_large, 1), "54000"),
                          (parted, ("b", 1, "ok", 1), "23514")]:
        with pytest.raises(RowsRejected, match=f"SQLSTATE {state}") as refused:
            t.prepare(0, "a", rows(row))
        assert not isinstance(refused.value, RowsInvalid), state
    assert [g for g in psycopg.connect(postgres.url, autocommit=True).execute(
        "SELECT gid FROM pg_prepared_xacts")] == []

    verdicts.commit(0, {"a": verdicts.prepare(0, "a", rows(("a", 7, "one", 1)))})
    assert verdicts.probe(1, "a", rows(("a", 7, "one", 1), ("a", 8, "two", 2))) is None  # 7 is in the table
    with pytest.raises(RowsRejected, match="SQLSTATE P0001"):  # the table's trigger, not a copy's
        verdicts.probe(1, "a", rows(("a", 8, "refused", 1)))
    with postgres.connect() as conn:
        conn.execute("INSERT INTO verdicts_off VALUES (1)")  # the trigger now refuses every row: an outage
    with pytest.raises(RowsRejected, match="SQLSTATE P0001"):
        verdicts.probe(1, "a", rows(("a", 8, "two", 2)))
    with postgres.connect() as conn:
        assert conn.execute('SELECT "offset" FROM verdicts').fetchall() == [(7,)]
        # a deferrable key cannot arbitrate ON CONFLICT: the probe defers it instead, and still runs the trigger
        conn.execute("DELETE FROM verdicts_off; ALTER TABLE verdicts ADD CONSTRAINT value_key UNIQUE (value) "
                     "DEFERRABLE")
    assert verdicts.probe(1, "a", rows(("a", 7, "one", 1), ("a", 8, "two", 2))) is None
    with pytest.raises(RowsRejected, match="SQLSTATE P0001"):
        verdicts.probe(1, "a", rows(("a", 8, "refused", 1)))
    with pytest.raises(RowsInvalid, match="SQLSTATE 23514"):
        verdicts.probe(1, "a", rows(("a", 8, "bad", 1)))
    with postgres.connect() as conn:
        assert conn.execute('SELECT "offset" FROM verdicts').fetchall() == [(7,)]
        assert conn.execute("SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                            "WHERE c.relname = 'verdicts'").fetchone() == (0,)


def test_a_row_postgres_refuses_for_its_own_sake_is_dead_lettered_in_seconds(spark, postgres, dirs, tmp_path):
    """Issue 55's fourth situation: 4 rows, one breaking a CHECK constraint; with the shipped retries (4, a minute
    apart) it waited for outage evidence (393 s). Now it is dead-lettered as soon as it stands alone."""
    from integration.test_postgres_target import assert_landed, start_to_postgres

    inp, _out, ck = dirs
    dlq = tmp_path / "dead-letters"
    add_epoch_of_files(inp, ["a", "b"], "001", 2)
    with postgres.connect() as conn:
        conn.execute('CREATE TABLE verdict_checked (region text, "offset" bigint, value text '
                     "CONSTRAINT no_b1 CHECK (value <> 'B-001-1'), PRIMARY KEY (region, \"offset\"))")
    query = start_to_postgres(regional_stream(spark, inp, ck), postgres, "verdict_checked", ck,
                              deadLetterPath=str(dlq),
                              **SHIPPED)
    try:
        took = run_until(query, ck, lambda st: all(st.regions[r].committed_offset == 2 for r in "ab")
                         if set(st.regions) >= set("ab") else False, timeout=240)
    finally:
        query.stop()
    letters = dead_letter_rows(dlq)
    assert [(r["region"], r["offset"]) for r in letters] == [("b", 1)]
    refused = "RowsInvalid: target=postgres: table verdict_checked refused the rows (SQLSTATE 23514)"
    assert refused in letters[0]["error"]
    with postgres.connect() as conn:
        assert sorted(conn.execute('SELECT region, "offset", value FROM verdict_checked').fetchall()) == [
            ("a", 0, "A-001-0"), ("a", 1, "A-001-1"), ("b", 0, "B-001-0")]
    assert_landed(postgres, "verdict_checked", {"a": ["A-001-0", "A-001-1"]}, ck, others=frozenset({"b"}))
    print(f"\nthe refused row dead-lettered in {took:.1f} s")
