"""target=postgres without a server: names, URLs, types and the CSV that COPY reads."""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal

import pyarrow as pa
import pytest

from regional.errors import RegionalConfigError
from regional.targets.postgres import (
    Attempt,
    Gid,
    PostgresTarget,
    TableName,
    _encoder,
    _gid_epoch,
    checkpoint_identity,
    current_attempt,
    parse_table,
    pg_type,
    region_key,
)

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
    assert _gid_epoch(f"regional:q:42:{key}:abc", "regional:q:") == 42
    assert _gid_epoch("regional:q:x:y", "regional:q:") == -1


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
        "numeric(12,3)", "jsonb", "bytea"]
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
    text = _encoder(batch.schema)(batch).decode()
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["a", "\\x00ff", "1.50", "2024-01-01 01:02:03.456789Z", '{"k": 1}']
    assert text.splitlines()[1] == '"",,,,'  # an empty string is quoted; NULL is an unquoted empty field
    assert rows[2][1:] == ["\\x", "-2.00", "1960-01-01 00:00:00.000000Z", '{"k": null}']
    assert rows[3][0] == 'x"y,z\nw'
