"""``target=postgres``, ``url=postgresql://user@host:port/db``, ``table=[schema.]table``.

Phase one (task): the region's rows are COPYed into the table, and a progress row goes into
``regional_commits`` (same schema as the table), in one transaction that is then ``PREPARE``d under a
gid naming the query, the epoch, the region, the table and this attempt (``Gid``). Phase two (driver):
``COMMIT PREPARED`` for the published regions' chosen gids, ``ROLLBACK PREPARED`` for the rest. A re-run
after a crash commits nothing twice: a gid still in ``pg_prepared_xacts`` is committed, a gid with a
progress row was committed before, and a gid with neither is an error (its rows are gone).

Attempts. Spark may run two attempts of one region in one epoch: a retry after a failure, a speculative
copy (``spark.speculation``), a zombie on an executor it lost. Only one attempt's commit message reaches
the driver, and that gid is the only one of the region and epoch ever ``COMMIT PREPARED``; nothing outside
the driver may roll it back. So:

- every attempt has its own gid and its own progress row (the row's key is the gid): attempts never wait
  for each other's locks in ``regional_commits``;
- ``prepare`` never rolls back a gid Spark may still commit. It rolls back only what Spark's scheduling
  proves dead: gids of the same region and epoch left by an earlier *run* of the query (a driver that died
  or stopped: the new run's driver finished any epoch that run decided before its tasks started), and,
  when speculation is off, earlier attempts of the same task in this run (Spark launches a retry only once
  the earlier attempt has failed, and never takes a failed attempt's result). The run is Spark's run id
  (``spark.jobGroup.id``), the attempt Spark's task attempt id: both in the gid. With speculation on, a
  same-run attempt is never rolled back by a task: on a table with a unique key a retry may then wait for a
  dead attempt's locks until ``lockTimeout`` (its region falls back for an epoch);
- the driver rolls back the attempts it did not choose: ``commit`` rolls back every other gid of the
  epoch once the chosen ones are committed, ``abort`` the handles it is given, and ``sweep`` every gid of
  the query's recorded epochs (a zombie that prepares after that is swept at the next epoch's start).

Leftovers of other queries. ``open`` (on the driver, before each epoch's tasks) also rolls back prepared
transactions on this table that another query id left and can never commit, and logs a warning naming
that query and how many. A gid belongs to this table when it carries the table's oid (``t<oid>``: an oid
names the table whatever the search_path or spelling, and a table cannot be dropped while a prepared
transaction holds a lock on it), or, for gids of earlier versions (no oid), when ``pg_locks`` shows it
holding a lock on the table. Another query's gid is rolled back only when that query provably cannot
commit it, or has been silent for long:

1. its checkpoint (``regional_queries``, where each query records its checkpoint and when it was last
   active) is now this query's: the checkpoint was wiped or replaced, so that query can never run again;
2. it has since committed a later epoch of the table (a progress row): a query commits an epoch's gids
   only before it moves to the next epoch;
3. it has shown no sign of life (its driver's ``open``, its tasks' PREPAREs, its progress rows) for
   ``orphanTimeout`` (default 1h), and has published nothing of that epoch yet (once it has, the rest of
   the epoch may be its to commit after a restart).

A time bound on a gid's own age would roll back a live query's work whenever its epoch outlasts the
bound; an advisory lock needs a session that lives as long as the query's driver, and the driver's Python
processes here live for one epoch. So a query writing the same table is never touched while it shows
activity; ``orphanTimeout`` must exceed the longest epoch of any query writing the table, and a query
killed after deciding an epoch but before publishing any of it must be restarted within it (otherwise
its restart fails naming the gid). Gids kept are reported too, with how to roll them back by hand.

Passwords come only from libpq's usual places (``PGPASSWORD``, ``~/.pgpass``, ``PGPASSFILE``): a URL
with a password, or a ``password`` option, is refused, since sink options are logged by Spark.

Spark types map to PostgreSQL types as ``PG_TYPES`` says (a table that does not exist is created
with them); an existing table must have every column of the query with a compatible type.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import re
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.csv as pacsv

from regional import failpoints
from regional.errors import RegionalConfigError, RegionalStoreError
from regional.targets.base import EpochReport, RegionalTarget, chain_first, require_query_id

log = logging.getLogger("regional")

COMMITS_TABLE = "regional_commits"
QUERIES_TABLE = "regional_queries"  # query id -> its checkpoint and when it was last active (leftover clean-up)
GID_PREFIX = "regional"
DEFAULT_ORPHAN_TIMEOUT = "1h"  # orphanTimeout: another query's leftovers are rolled back after this long idle
DRIVER_RETRY_S = 30.0  # the driver's own statements wait this long for a restarting server
KEEP_PROGRESS_EPOCHS = 100  # progress rows older than this many recorded epochs are deleted
DEFAULT_LOCK_TIMEOUT = "60s"  # lockTimeout: PostgreSQL's lock_timeout for the tasks' COPY

# Spark type (as Arrow hands it over) -> the column type a missing table is created with.
PG_TYPES: dict[str, str] = {
    "string": "text", "large_string": "text", "binary": "bytea", "large_binary": "bytea", "bool": "boolean",
    "int8": "smallint", "int16": "smallint", "int32": "integer", "int64": "bigint",
    "float": "real", "double": "double precision", "date32": "date",
    "timestamp": "timestamp with time zone", "timestamp_ntz": "timestamp without time zone",
    "decimal": "numeric", "nested": "jsonb",
}
# ... and the existing column types each one may be written into.
_COMPATIBLE: dict[str, set[str]] = {
    "text": {"text", "character varying", "character", "json", "jsonb", "uuid", "citext", "name"},
    "bytea": {"bytea"},
    "boolean": {"boolean"},
    "smallint": {"smallint", "integer", "bigint", "numeric", "real", "double precision"},
    "integer": {"integer", "bigint", "numeric", "double precision"},
    "bigint": {"bigint", "numeric"},
    "real": {"real", "double precision", "numeric"},
    "double precision": {"double precision", "numeric"},
    "date": {"date", "timestamp with time zone", "timestamp without time zone"},
    "timestamp with time zone": {"timestamp with time zone"},
    "timestamp without time zone": {"timestamp without time zone"},
    "numeric": {"numeric"},
    "jsonb": {"jsonb", "json"},
}


def create(options: dict[str, str]) -> PostgresTarget:
    return PostgresTarget(options)


@dataclass(frozen=True)
class TableName:
    schema: str | None
    name: str

    def sql(self) -> Any:
        from psycopg import sql

        return sql.Identifier(*([self.schema] if self.schema else []), self.name)

    def sibling(self, name: str) -> TableName:
        return TableName(self.schema, name)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name


def parse_table(text: str) -> TableName:
    """``table``, ``schema.table``, with double-quoted parts for names holding dots or quotes (SQL's rules:
    unquoted parts fold to lower case, ``""`` inside quotes is a quote)."""
    parts: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == '"':
            j, part = i + 1, []
            while True:
                if j >= n:
                    raise RegionalConfigError(f"table {text!r}: unterminated double quote")
                if text[j] == '"':
                    if j + 1 < n and text[j + 1] == '"':
                        part.append('"')
                        j += 2
                        continue
                    break
                part.append(text[j])
                j += 1
            parts.append("".join(part))
            i = j + 1
        else:
            j = text.find(".", i)
            j = n if j < 0 else j
            parts.append(text[i:j].strip().lower())
            i = j
        if i < n:
            if text[i] != ".":
                raise RegionalConfigError(f"table {text!r}: expected '.' after a quoted name")
            i += 1
            if i == n:
                parts.append("")
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise RegionalConfigError(f"table {text!r} must be 'table' or 'schema.table' (quote names with dots "
                                  "in double quotes)")
    return TableName(parts[0], parts[1]) if len(parts) == 2 else TableName(None, parts[0])


def check_url(url: str | None) -> str:
    if not url:
        raise RegionalConfigError("target=postgres needs .option('url', 'postgresql://user@host:port/database')")
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise RegionalConfigError(f"target=postgres: url must start with postgresql://, got scheme "
                                  f"{parts.scheme!r}")
    if parts.password is not None or "password=" in (parts.query or ""):
        raise RegionalConfigError(
            "target=postgres: the url holds a password, and sink options are logged by Spark. Remove it from the "
            "url and give it the libpq way: the PGPASSWORD environment variable (of the driver and the executors) "
            "or a ~/.pgpass file")
    return url


def region_key(region: str) -> str:
    """A region's part of a gid: bounded and made of safe characters whatever the region id."""
    return hashlib.sha256(region.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Attempt:
    """The Spark task attempt running ``prepare`` (all None outside a Spark task)."""

    run: str | None = None  # the query run (Spark's run id, 16 hex digits): a new one at every start
    partition: int | None = None
    task: int | None = None  # Spark's task attempt id: unique in the application, a later attempt's is higher
    sequential: bool = False  # Spark's conf is visible and spark.speculation is off: a task's attempts never overlap


def current_attempt() -> Attempt:
    try:
        from pyspark import TaskContext
    except ImportError:
        return Attempt()
    context = TaskContext.get()
    if context is None:
        return Attempt()
    group = (context.getLocalProperty("spark.jobGroup.id") or "").replace("-", "").lower()
    run = group[:16] if re.fullmatch(r"[0-9a-f]{16,64}", group) else None
    # Spark propagates its conf (spark.master among it) to tasks as local properties; without it, whether
    # speculation is on is unknown, and attempts are treated as possibly overlapping.
    conf_visible = context.getLocalProperty("spark.master") is not None
    speculation = (context.getLocalProperty("spark.speculation") or "false").strip().lower() == "true"
    return Attempt(run, context.partitionId(), context.taskAttemptId(), conf_visible and not speculation)


@dataclass(frozen=True)
class Gid:
    """A prepared transaction's gid: ``regional:<query id>:<epoch>:<region hash>:<nonce>`` (all versions), then
    ``:t<table oid>:r<run>:p<partition>:a<task attempt id>`` (``-`` for unknown). At most about 160 characters
    (PostgreSQL allows 200)."""

    query_id: str
    epoch: int
    region: str  # region_key(region)
    nonce: str
    table: int | None = None  # None: a gid of an earlier version, which did not name its table
    run: str | None = None
    partition: int | None = None
    task: int | None = None

    def __str__(self) -> str:
        text = f"{GID_PREFIX}:{self.query_id}:{self.epoch}:{self.region}:{self.nonce}"
        if self.table is None:
            return text
        return f"{text}:t{self.table}:r{self.run or '-'}:p{_or_dash(self.partition)}:a{_or_dash(self.task)}"

    @classmethod
    def parse(cls, text: str) -> Gid | None:
        """The gid's parts, or None for a gid regional did not write."""
        parts = text.split(":")
        if parts[0] != GID_PREFIX or len(parts) not in (5, 9):
            return None
        try:
            epoch = int(parts[2])
            if len(parts) == 5:
                return cls(parts[1], epoch, parts[3], parts[4])
            tags = [part[:1] for part in parts[5:]]
            if tags != ["t", "r", "p", "a"]:
                return None
            table, run, partition, task = (part[1:] for part in parts[5:])
            return cls(parts[1], epoch, parts[3], parts[4], int(table), None if run == "-" else run,
                       _dash_or_int(partition), _dash_or_int(task))
        except ValueError:
            return None


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _dash_or_int(text: str) -> int | None:
    return None if text == "-" else int(text)


def checkpoint_identity(location: str | None) -> str | None:
    """A checkpoint location as a name that two drivers using the same checkpoint share, and two drivers
    on different machines with the same local path do not: local paths get the host and are made absolute;
    URIs lose any user info."""
    if not location:
        return None
    parts = urlsplit(location)
    if parts.scheme in ("", "file") or len(parts.scheme) == 1:  # a plain path (C:\... too) or file:
        path = parts.path if parts.scheme == "file" else location
        return f"file://{socket.gethostname()}{os.path.realpath(path)}"
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return f"{parts.scheme}://{netloc}{parts.path.rstrip('/') or '/'}"


def pg_type(field: pa.Field) -> str:
    t = field.type
    if pa.types.is_timestamp(t):
        return PG_TYPES["timestamp" if t.tz else "timestamp_ntz"]
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_nested(t):
        return PG_TYPES["nested"]
    name = {pa.float32(): "float", pa.float64(): "double", pa.date32(): "date32"}.get(t, str(t))
    if name not in PG_TYPES:
        raise RegionalConfigError(f"target=postgres: column {field.name!r} has type {t}, which has no PostgreSQL "
                                  "column type here; cast it in your select(...)")
    return PG_TYPES[name]


class PostgresTarget(RegionalTarget):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        if "password" in options:
            raise RegionalConfigError("target=postgres: do not pass a 'password' option (sink options are logged); "
                                      "use PGPASSWORD or ~/.pgpass, as libpq does")
        self.url = check_url(options.get("url"))
        if not options.get("table"):
            raise RegionalConfigError("target=postgres needs .option('table', 'schema.table')")
        self.table = parse_table(options["table"])
        self.commits = self.table.sibling(COMMITS_TABLE)
        query_id = require_query_id("postgres", options)
        self.query_id = query_id
        self.gid_prefix = f"{GID_PREFIX}:{query_id}:"
        # A task never waits for ever on a lock (a row another transaction holds): it fails, and its region
        # falls back, instead of stalling the epoch.
        self.lock_timeout = options.get("locktimeout", DEFAULT_LOCK_TIMEOUT)
        self.orphan_timeout = options.get("orphantimeout", DEFAULT_ORPHAN_TIMEOUT)
        self.queries = self.table.sibling(QUERIES_TABLE)
        self.checkpoint = checkpoint_identity(options.get("checkpointlocation"))

    # -- connections -------------------------------------------------------------------------------

    def _connect(self, autocommit: bool) -> Any:
        import psycopg

        conn = psycopg.connect(self.url, autocommit=autocommit, application_name="regional")
        conn.execute("SELECT set_config('lock_timeout', %s, false)", (self.lock_timeout,))
        return conn

    def _on_driver(self, work: Callable[[Any], Any]) -> Any:
        """Run ``work`` on an autocommit connection, retrying while the server cannot be reached (a restart):
        the driver's statements are idempotent."""
        import psycopg

        deadline = time.monotonic() + DRIVER_RETRY_S
        while True:
            try:
                with self._connect(autocommit=True) as conn:
                    return work(conn)
            except psycopg.DataError as exc:  # _connect's set_config: lockTimeout fails here, on the driver
                raise RegionalConfigError(f"target=postgres: lockTimeout={self.lock_timeout!r} is not a PostgreSQL "
                                          f"lock_timeout ({str(exc).strip()}); give e.g. '60s' or '500ms'") from None
            except psycopg.OperationalError as exc:
                if time.monotonic() >= deadline:
                    raise RegionalStoreError(
                        f"target=postgres: cannot reach the server at {_safe_url(self.url)} for "
                        f"{DRIVER_RETRY_S:.0f} s ({str(exc).strip().splitlines()[0]}). The epoch is not finished: "
                        "restart the query when the server is back; nothing is published twice") from None
                time.sleep(0.5)

    # -- on the driver, before each epoch's tasks -----------------------------------------------------

    def open(self, schema: pa.Schema) -> None:
        """Check the server, create the table (from the rows' schema), ``regional_commits`` and
        ``regional_queries`` if missing, check an existing table's columns, record this query as active, and
        roll back (and report) what other queries left prepared on the table and can never commit."""
        self._on_driver(lambda conn: self._open(conn, schema))

    def _open(self, conn: Any, schema: pa.Schema) -> None:
        from psycopg import sql

        (limit,) = conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
        if limit == 0:
            raise RegionalConfigError(
                f"target=postgres: the server at {_safe_url(self.url)} has max_prepared_transactions = 0, so it "
                "cannot PREPARE TRANSACTION. Set max_prepared_transactions (at least the number of regions per "
                "epoch, e.g. 64) in postgresql.conf and restart the server")
        cutoff = self._orphan_cutoff(conn)
        index = sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (query_id, epoch)").format(
            sql.Identifier(f"{COMMITS_TABLE}_query_epoch"), self.commits.sql())
        self._create_missing(conn, self.commits, _COMMITS_COLUMNS, index)
        self._create_missing(conn, self.queries, _QUERIES_COLUMNS)
        wanted = [(f.name, pg_type(f)) for f in schema]
        self._check_columns(self._create_missing(conn, self.table, wanted), wanted)
        conn.execute(sql.SQL("INSERT INTO {} (query_id, checkpoint, seen_at) VALUES (%s, %s, now()) "
                             "ON CONFLICT (query_id) DO UPDATE SET checkpoint = EXCLUDED.checkpoint, seen_at = now()")
                     .format(self.queries.sql()), (self.query_id, self.checkpoint))
        self._roll_back_leftovers(conn, cutoff)

    def _orphan_cutoff(self, conn: Any) -> datetime:
        """now() - orphanTimeout, on the server's clock."""
        from psycopg import errors

        try:
            (cutoff,) = conn.execute("SELECT now() - %s::interval", (self.orphan_timeout,)).fetchone()
        except (errors.DataError, errors.SyntaxError) as exc:
            raise RegionalConfigError(
                f"target=postgres: orphanTimeout={self.orphan_timeout!r} is not a PostgreSQL interval "
                f"({str(exc).strip().splitlines()[0]}); give e.g. '1h' or '30 min'") from None
        return cutoff

    def _roll_back_leftovers(self, conn: Any, cutoff: datetime) -> None:
        """Roll back, and report, what other query ids left prepared on this table and can never commit
        (see the module's docstring); report what is kept."""
        from psycopg import sql

        oid = self._table_oid(conn)
        rows = conn.execute(
            "SELECT p.gid, p.prepared, EXISTS (SELECT 1 FROM pg_locks x JOIN pg_locks r "
            "  ON r.virtualtransaction = x.virtualtransaction AND r.pid IS NULL "
            "  WHERE x.locktype = 'transactionid' AND x.transactionid = p.transaction AND x.pid IS NULL "
            "  AND r.locktype = 'relation' AND r.relation = %s) "
            "FROM pg_prepared_xacts p WHERE p.database = current_database() AND p.gid LIKE %s",
            (oid, f"{GID_PREFIX}:%")).fetchall()
        newest: dict[str, datetime] = {}  # query id -> its newest PREPARE, on any table
        theirs: dict[str, dict[str, Gid]] = defaultdict(dict)  # query id -> its gids on this table
        for text, prepared_at, locks_table in rows:
            gid = Gid.parse(text)
            if gid is None or gid.query_id == self.query_id:
                continue
            newest[gid.query_id] = max(prepared_at, newest.get(gid.query_id, prepared_at))
            if (gid.table == oid) if gid.table is not None else locks_table:
                theirs[gid.query_id][text] = gid
        for other, gids in sorted(theirs.items()):
            checkpoint, seen_at, last_epoch, last_progress = conn.execute(
                sql.SQL("SELECT (SELECT checkpoint FROM {q} WHERE query_id = %(id)s), "
                        "(SELECT seen_at FROM {q} WHERE query_id = %(id)s), "
                        "(SELECT max(epoch) FROM {c} WHERE query_id = %(id)s), "
                        "(SELECT max(prepared_at) FROM {c} WHERE query_id = %(id)s)").format(
                    q=self.queries.sql(), c=self.commits.sql()), {"id": other}).fetchone()
            published = {epoch for (epoch,) in conn.execute(
                sql.SQL("SELECT DISTINCT epoch FROM {} WHERE query_id = %s AND epoch = ANY(%s)").format(
                    self.commits.sql()), (other, sorted({g.epoch for g in gids.values()})))}
            last_active = max(t for t in (seen_at, last_progress, newest[other]) if t is not None)
            replaced = self.checkpoint is not None and checkpoint == self.checkpoint
            idle = last_active < cutoff
            gone: dict[str, dict[str, Gid]] = defaultdict(dict)
            kept: dict[str, Gid] = {}
            for text, gid in sorted(gids.items()):
                if replaced:
                    gone[f"its checkpoint {checkpoint} now belongs to query {self.query_id}: it was wiped or "
                         "replaced, so that query can never commit them"][text] = gid
                elif last_epoch is not None and last_epoch > gid.epoch:
                    gone[f"it has since committed epoch {last_epoch}, and never commits an earlier epoch's "
                         "prepared transactions"][text] = gid
                elif idle and gid.epoch not in published:
                    gone[f"it has shown no activity since {last_active:%Y-%m-%d %H:%M:%S %Z}, longer than "
                         f"orphanTimeout={self.orphan_timeout}"][text] = gid
                else:
                    kept[text] = gid
            for why, doomed in gone.items():
                done = self._roll_back_gids(conn, doomed)
                if done:
                    log.warning("regional: target=postgres rolled back %d prepared transaction(s) that query %s "
                                "left on table %s (epochs %s): %s", done, other, self.table,
                                _epochs_text(doomed.values()), why)
            if kept:
                log.warning(
                    "regional: target=postgres: %d prepared transaction(s) of query %s (epochs %s, last active "
                    "%s) hold locks on table %s; they are kept while that query may still commit them, and rolled "
                    "back once it has been inactive for orphanTimeout=%s and has published nothing of their "
                    "epoch. If query %s is gone for good, roll them back by hand (as their owner or a superuser): "
                    "%s", len(kept), other, _epochs_text(kept.values()), f"{last_active:%Y-%m-%d %H:%M:%S %Z}",
                    self.table, self.orphan_timeout, other,
                    "; ".join(f"ROLLBACK PREPARED '{g}'" for g in sorted(kept)[:3]) + ("; ..." * (len(kept) > 3)))

    def _create_missing(self, conn: Any, table: TableName, columns: list[tuple[str, str]],
                        then: Any = None) -> dict[str, tuple[str, bool]]:
        """``table``'s columns, after creating it with ``columns`` (and running ``then``) if it did not exist."""
        from psycopg import errors, sql

        have = self._columns(conn, table)
        if have is not None:
            return have
        ddl = sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            table.sql(), sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns))
        try:
            conn.execute(ddl if then is None else sql.SQL("{} ; {}").format(ddl, then))
        except errors.UniqueViolation:
            pass  # created by another query at the same moment
        return self._columns(conn, table) or {}

    def _columns(self, conn: Any, table: TableName) -> dict[str, tuple[str, bool]] | None:
        """column -> (type, NOT NULL without a default), or None when the table does not exist."""
        (oid,) = conn.execute("SELECT to_regclass(%s)::oid", (table.sql().as_string(conn),)).fetchone()
        if oid is None:
            return None
        rows = conn.execute(
            "SELECT attname, format_type(atttypid, NULL), attnotnull AND NOT atthasdef FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped", (oid,)).fetchall()
        return {name: (kind, required) for name, kind, required in rows}

    def _check_columns(self, have: dict[str, tuple[str, bool]], wanted: list[tuple[str, str]]) -> None:
        problems = []
        for name, kind in wanted:
            base = kind.split("(")[0]
            if name not in have:
                problems.append(f"column {name!r} ({kind}) is missing")
            elif have[name][0] not in _COMPATIBLE[base]:
                problems.append(f"column {name!r} is {have[name][0]}, the query writes {kind}")
        names = {n for n, _k in wanted}
        problems += [f"column {n!r} is NOT NULL without a default, and the query does not write it"
                     for n, (_k, required) in sorted(have.items()) if required and n not in names]
        if problems:
            raise RegionalConfigError(
                f"target=postgres: table {self.table} does not fit the query: {'; '.join(problems)}. Alter the "
                "table, select(...) matching columns, or write to a new table (regional creates a missing one)")

    # -- phase one, in the task -----------------------------------------------------------------

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> dict[str, Any] | None:
        from psycopg import sql

        first = next(batches, None)
        if first is None:
            return None
        attempt = current_attempt()
        # Not ``with conn``: its exit would COMMIT, which a prepared (two-phase) transaction refuses.
        conn = self._connect(autocommit=True)
        try:
            gid = str(Gid(self.query_id, epoch, region_key(region), uuid.uuid4().hex[:12], self._table_oid(conn),
                          attempt.run, attempt.partition, attempt.task))
            self._roll_back_dead_attempts(conn, epoch, region, attempt)  # their locks would block this one
            conn.autocommit = False
            conn.tpc_begin(gid)
            try:
                encode = _encoder(first.schema)
                copy_sql = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
                    self.table.sql(), sql.SQL(", ").join(sql.Identifier(n) for n in first.schema.names))
                rows = 0
                with conn.cursor() as cur:
                    with cur.copy(copy_sql) as copy:
                        for batch in chain_first(first, batches):
                            copy.write(encode(batch))
                            rows += batch.num_rows
                    # The progress row's key is the gid: two attempts never wait for each other's row.
                    cur.execute(sql.SQL("INSERT INTO {} (query_id, region, epoch, gid, row_count) "
                                        "VALUES (%s, %s, %s, %s, %s)").format(self.commits.sql()),
                                (self.query_id, region, epoch, gid, rows))
                conn.tpc_prepare()
            except BaseException:
                if not conn.closed:
                    conn.tpc_rollback()
                raise
        finally:
            conn.close()
        return {"gid": gid, "rows": rows}

    def _roll_back_dead_attempts(self, conn: Any, epoch: int, region: str, me: Attempt) -> None:
        """Roll back the gids of this region and epoch that Spark can no longer commit: those of an earlier
        run of the query, and (speculation off) earlier attempts of this task. Never a gid Spark may commit:
        another attempt of this run that may overlap this one (speculation, or a zombie, which is always the
        earlier attempt) is left to the driver."""
        if me.run is None:
            return  # not in a Spark task: nothing is known about the other attempts
        dead = []
        for text in self._prepared(conn, f"{self.gid_prefix}{epoch}:{region_key(region)}:"):
            other = Gid.parse(text)
            if other is None:
                continue
            if other.run != me.run or (me.sequential and other.partition == me.partition
                                        and other.task is not None and me.task is not None and other.task < me.task):
                dead.append(text)
        self._roll_back_gids(conn, dead)

    # -- phase two, on the driver -----------------------------------------------------------------

    def commit(self, epoch: int, handles: dict[str, Any], report: EpochReport | None = None) -> None:
        gids = {region: h["gid"] for region, h in handles.items() if h is not None}
        if gids:
            self._on_driver(lambda conn: self._commit(conn, epoch, gids))

    def _commit(self, conn: Any, epoch: int, gids: dict[str, str]) -> None:
        """COMMIT PREPARED the chosen gids (only these are ever committed), then roll back every other
        attempt of the epoch: the driver chose, and commit receives all the epoch's published handles."""
        from psycopg import sql

        prefix = f"{self.gid_prefix}{epoch}:"
        prepared = self._prepared(conn, prefix)
        done = {gid for (gid,) in conn.execute(
            sql.SQL("SELECT gid FROM {} WHERE query_id = %s AND epoch = %s").format(self.commits.sql()),
            (self.query_id, epoch))}
        for i, (region, gid) in enumerate(sorted(gids.items())):
            if i == 1:
                failpoints.reach("between_commits", epoch)  # one region committed, the others not yet
            if gid in prepared:
                conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
            elif gid not in done:  # neither prepared nor committed: its rows are gone
                raise RegionalStoreError(
                    f"target=postgres: epoch {epoch} of region {region!r} was staged as prepared transaction "
                    f"{gid!r}, which is neither in pg_prepared_xacts nor committed in {self.commits}: it was rolled "
                    "back outside regional (by hand, or by another query with the same checkpoint). Its rows cannot "
                    "be published; restore the checkpoint and the table from a backup, or start a new "
                    "checkpointLocation")
        self._roll_back_gids(conn, self._prepared(conn, prefix) - set(gids.values()))

    def abort(self, epoch: int, handles: dict[str, Any]) -> None:
        gids = {h["gid"] for h in handles.values() if isinstance(h, dict) and "gid" in h}
        if gids:
            self._on_driver(lambda conn: self._roll_back_gids(conn, self._prepared(conn, f"{self.gid_prefix}{epoch}:")
                                                              & gids))

    def published(self, epoch: int) -> bool:
        from psycopg import sql

        return bool(self._on_driver(lambda conn: conn.execute(
            sql.SQL("SELECT 1 FROM {} WHERE query_id = %s AND epoch = %s LIMIT 1").format(self.commits.sql()),
            (self.query_id, epoch)).fetchone()))

    def sweep(self, up_to_epoch: int) -> None:
        """Roll back this query's prepared transactions of recorded epochs (left by dead tasks or drivers):
        none may keep holding locks or hold back VACUUM. Old progress rows go too."""
        from psycopg import sql

        def work(conn: Any) -> None:
            self._roll_back_gids(conn, [gid for gid in self._prepared(conn, self.gid_prefix)
                                        if _gid_epoch(gid, self.gid_prefix) <= up_to_epoch])
            if self._columns(conn, self.commits) is not None:
                conn.execute(sql.SQL("DELETE FROM {} WHERE query_id = %s AND epoch < %s").format(self.commits.sql()),
                             (self.query_id, up_to_epoch - KEEP_PROGRESS_EPOCHS))

        self._on_driver(work)

    # -- helpers -----------------------------------------------------------------------------------

    @staticmethod
    def _prepared(conn: Any, prefix: str) -> set[str]:
        """Gids starting with ``prefix`` prepared in this database (pg_prepared_xacts spans the server)."""
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        return {gid for (gid,) in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE %s", (pattern,))}

    def _table_oid(self, conn: Any) -> int:
        """The table's oid (0 when it does not exist: its COPY then fails)."""
        (oid,) = conn.execute("SELECT to_regclass(%s)::oid", (self.table.sql().as_string(conn),)).fetchone()
        return int(oid or 0)

    @staticmethod
    def _roll_back_gids(conn: Any, gids: Iterable[str]) -> int:
        """ROLLBACK PREPARED each; how many this call rolled back. One rolled back meanwhile is skipped; one
        this role may not roll back (another role prepared it) is reported."""
        from psycopg import errors, sql

        done = 0
        for gid in gids:
            try:
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
                done += 1
            except errors.UndefinedObject:
                pass  # rolled back or committed by someone else meanwhile
            except errors.InsufficientPrivilege:
                log.warning("regional: target=postgres may not roll back prepared transaction %r (another role "
                            "prepared it, and it holds locks): roll it back as that role or as a superuser: "
                            "ROLLBACK PREPARED '%s'", gid, gid)
        return done


_COMMITS_COLUMNS = [("query_id", "text NOT NULL"), ("region", "text NOT NULL"), ("epoch", "bigint NOT NULL"),
                    ("gid", "text PRIMARY KEY"), ("row_count", "bigint NOT NULL"),
                    ("prepared_at", "timestamp with time zone NOT NULL DEFAULT now()")]
_QUERIES_COLUMNS = [("query_id", "text PRIMARY KEY"), ("checkpoint", "text"),
                    ("seen_at", "timestamp with time zone NOT NULL DEFAULT now()")]


def _epochs_text(gids: Iterable[Gid]) -> str:
    return ", ".join(str(e) for e in sorted({g.epoch for g in gids}))


def _gid_epoch(gid: str, prefix: str) -> int:
    """The epoch of one of this query's gids (``prefix``: ``regional:<query id>:``); -1 if unreadable."""
    try:
        return int(gid[len(prefix):].split(":", 1)[0])
    except ValueError:
        return -1


def _safe_url(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5432}{parts.path}"


def _encoder(schema: pa.Schema) -> Callable[[pa.RecordBatch], bytes]:
    """Arrow rows -> PostgreSQL CSV (an unquoted empty field is NULL; Arrow quotes every string). Binary and
    nested columns, which CSV cannot carry as they are, become bytea hex text and JSON text."""
    special = {i: convert for i, f in enumerate(schema) if (convert := _csv_converter(f.type)) is not None}
    options = pacsv.WriteOptions(include_header=False)

    def encode(batch: pa.RecordBatch) -> bytes:
        for i, convert in special.items():
            batch = batch.set_column(i, batch.schema.field(i).name, convert(batch.column(i)))
        out = io.BytesIO()
        pacsv.write_csv(batch, out, options)
        return out.getvalue()

    return encode


def _csv_converter(type_: pa.DataType) -> Callable[[pa.Array], pa.Array] | None:
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        return _hex
    return _json if pa.types.is_nested(type_) else None


def _hex(column: pa.Array) -> pa.Array:
    return pa.array([None if v is None else "\\x" + v.hex() for v in column.to_pylist()], pa.string())


def _json(column: pa.Array) -> pa.Array:
    def plain(v: Any) -> Any:
        if isinstance(v, bytes):
            return base64.b64encode(v).decode("ascii")
        if isinstance(v, list) and v and isinstance(v[0], tuple):  # a map: [(key, value), ...]
            return {str(k): plain(x) for k, x in v}
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    return pa.array([None if v is None else json.dumps(plain(v), default=str) for v in column.to_pylist()],
                    pa.string())
