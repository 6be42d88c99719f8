"""``target=postgres``: the two-phase committer (the package's docstring says how it works).

On the driver: ``open`` (check the server, create what is missing, match the table's columns, roll back other
queries' leftovers), ``commit``, ``abort``, ``sweep``. In each region's task: ``prepare`` (COPY, progress row,
PREPARE TRANSACTION).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

import pyarrow as pa

from regional import failpoints
from regional.errors import RegionalConfigError, RegionalStoreError
from regional.targets.base import (
    EpochReport,
    RegionalTarget,
    RowsInvalid,
    RowsRejected,
    chain_first,
    require_query_id,
)
from regional.targets.postgres.encoding import encoder
from regional.targets.postgres.names import (
    GID_PREFIX,
    Attempt,
    Gid,
    TableName,
    checkpoint_identity,
    current_attempt,
    gid_epoch,
    region_key,
    safe_url,
)
from regional.targets.postgres.schema import (
    DATE_INTO_ZONED,
    base_type,
    compatible,
    fits,
    match_columns,
    parse_column_types,
    pg_type,
    writes_json,
    writes_multidimensional,
)
from regional.targets.postgres.settings import OPTIONS, Settings

log = logging.getLogger("regional")

COMMITS_TABLE = "regional_commits"
QUERIES_TABLE = "regional_queries"  # query id -> its checkpoint and when it was last active (leftover clean-up)
DRIVER_RETRY_S = 30.0  # the driver's own statements wait this long for a restarting server
KEEP_PROGRESS_EPOCHS = 100  # progress rows older than this many recorded epochs are deleted
# What open() found, for the tasks' copies (task_options): the table's column for each of the query's, and the
# arrays written as JSON (into json or jsonb columns).
COLUMNS_KEY = "regional.postgres.columns"
JSON_KEY = "regional.postgres.json"
NESTED_KEY = "regional.postgres.multidimensional"  # arrays of arrays written into array columns (not as JSON)
# Which errors are about the rows (docs/targets/postgres.md, "Errors about a row"), by SQLSTATE: its class (2
# characters) or the code itself. The rows' own fault (``RowsInvalid``: an isolated record refused with it is
# dead-lettered at once): a data exception (22: a value the column cannot take), a NOT NULL column it breaks, a CHECK
# constraint it breaks (23514 naming a constraint: not a partition that does not exist yet, which a job may create).
ROWS_INVALID = ("22", "23502")
CHECK_VIOLATION = "23514"
# About a row, but perhaps not for its own sake (``RowsRejected``: isolated, dead-lettered on evidence only, as a
# UDF's unknown exception): the other integrity violations (a unique or foreign key: other rows), a trigger's
# RAISE or ASSERT (P0001, P0004), a row too large for an index (54000).
ROWS_REFUSED = ("23", "P0001", "P0004", "54000")
# Anything else is the target's failure (the region falls back, nothing is isolated): connection loss (08), the
# server shutting down (57P01), insufficient resources (53), serialization failures and deadlocks (40), lock and
# statement timeouts (55P03, 57014), a privilege (42501; row-level security refuses COPY itself, 0A000, whatever
# the rows).


def rows_verdict(sqlstate: str, constraint: str | None = None) -> type[RowsRejected] | None:
    """What a PostgreSQL error with ``sqlstate`` (and ``constraint``, the constraint it names) says of the rows
    it refused: ``RowsInvalid`` (their own fault), ``RowsRejected`` (about them, perhaps not for their own sake),
    None (the server's or the target's failure)."""
    if sqlstate[:2] in ROWS_INVALID or sqlstate in ROWS_INVALID or (sqlstate == CHECK_VIOLATION and constraint):
        return RowsInvalid
    if sqlstate[:2] in ROWS_REFUSED or sqlstate in ROWS_REFUSED:
        return RowsRejected
    return None


class PostgresTarget(RegionalTarget):
    OPTIONS = OPTIONS

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.settings = Settings.of(options)
        self.url = self.settings.url
        self.table = self.settings.table
        self.commits = self.table.sibling(COMMITS_TABLE)
        query_id = require_query_id("postgres", options)
        self.query_id = query_id
        self.gid_prefix = f"{GID_PREFIX}:{query_id}:"
        # A task never waits for ever on a lock (a row another transaction holds): it fails, and its region
        # falls back, instead of stalling the epoch.
        self.lock_timeout = self.settings.lock_timeout
        self.orphan_timeout = self.settings.orphan_timeout
        self.queries = self.table.sibling(QUERIES_TABLE)
        self.checkpoint = checkpoint_identity(options.get("checkpointlocation"))
        # What the driver's open() found (absent outside a query's tasks: the rows' own names, arrays as arrays).
        self.columns: dict[str, str] | None = json.loads(options[COLUMNS_KEY]) if COLUMNS_KEY in options else None
        self.json_columns: list[str] = json.loads(options.get(JSON_KEY, "[]"))
        self.nested_columns: list[str] = json.loads(options.get(NESTED_KEY, "[]"))

    # -- connections -------------------------------------------------------------------------------

    def _connect(self, autocommit: bool) -> Any:
        import psycopg

        extra: dict[str, Any] = {"user": self.settings.user} if self.settings.user else {}
        conn = psycopg.connect(self.url, autocommit=autocommit, application_name="regional", **extra)
        # TimeZone UTC: the COPY's timestamps are UTC wall-clock times (encoding), read as those instants.
        conn.execute("SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false), "
                     "set_config('TimeZone', 'UTC', false)", (self.lock_timeout, f"{self.settings.query_timeout_s}s"))
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
                        f"target=postgres: cannot reach the server at {safe_url(self.url)} for "
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
                f"target=postgres: the server at {safe_url(self.url)} has max_prepared_transactions = 0, so it "
                "cannot PREPARE TRANSACTION. Set max_prepared_transactions (at least the number of regions per "
                "epoch, e.g. 64) in postgresql.conf and restart the server")
        cutoff = self._orphan_cutoff(conn)
        index = sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (query_id, epoch)").format(
            sql.Identifier(f"{COMMITS_TABLE}_query_epoch"), self.commits.sql())
        self._create_missing(conn, self.commits, _COMMITS_COLUMNS, index)
        self._create_missing(conn, self.queries, _QUERIES_COLUMNS)
        self._match_table(conn, schema)
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

    def _create_missing(self, conn: Any, table: TableName, columns: list[tuple[str, str]], then: Any = None,
                        options: str = "") -> dict[str, tuple[str, bool]]:
        """``table``'s columns, after creating it with ``columns`` (``CREATE TABLE ... <options>``, then running
        ``then``) if it did not exist."""
        from psycopg import errors, sql

        have = self._columns(conn, table)
        if have is not None:
            return have
        ddl = sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}) {}").format(
            table.sql(), sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns),
            sql.SQL(options))
        try:
            conn.execute(ddl if then is None else sql.SQL("{} ; {}").format(ddl, then))
        except errors.UniqueViolation:
            pass  # created by another query at the same moment
        except (errors.SyntaxError, errors.UndefinedObject, errors.InvalidParameterValue, errors.DatatypeMismatch,
                errors.InvalidTableDefinition, errors.FeatureNotSupported) as exc:
            raise RegionalConfigError(
                f"target=postgres: PostgreSQL refused to create table {table} ({str(exc).strip().splitlines()[0]}): "
                "check createTableColumnTypes (Spark SQL types, e.g. VARCHAR(8), INT, DECIMAL(10,2)) and "
                "createTableOptions, or create the table yourself") from None
        return self._columns(conn, table) or {}

    def _columns(self, conn: Any, table: TableName) -> dict[str, tuple[str, bool]] | None:
        """column -> (type, NOT NULL without a default), in the table's order; None when the table does not exist."""
        (oid,) = conn.execute("SELECT to_regclass(%s)::oid", (table.sql().as_string(conn),)).fetchone()
        if oid is None:
            return None
        rows = conn.execute(
            "SELECT attname, format_type(atttypid, NULL), attnotnull AND NOT atthasdef FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (oid,)).fetchall()
        return {name: (kind, required) for name, kind, required in rows}

    def _match_table(self, conn: Any, schema: pa.Schema) -> None:
        """Create the table if missing (as Spark's JDBC writer creates it: its types, createTableColumnTypes,
        NOT NULL for non-nullable fields, createTableOptions, tableComment); match the query's columns to the
        table's as Spark's JDBC writer does (without case), and check their types."""
        from psycopg import sql

        user_types = parse_column_types(self.settings.column_types, schema.names) if self.settings.column_types \
            else None
        wanted = [(f.name, pg_type(f)) for f in schema]
        # NOT NULL for a non-nullable field, with the user's type too, as Spark's JDBC writer creates it.
        created = [(f.name, ((user_types and user_types.type_of(f.name)) or kind) + ("" if f.nullable else " NOT NULL"))
                   for f, (_n, kind) in zip(schema, wanted, strict=True)]
        (longest,) = conn.execute("SELECT current_setting('max_identifier_length')::int").fetchone()
        too_long = [n for n, _k in wanted if len(n.encode()) > longest]
        if too_long:  # PostgreSQL would cut them in CREATE TABLE and never find them again
            raise RegionalConfigError(
                "target=postgres: " + "; ".join(f"column {n!r} has a {len(n.encode())}-byte name" for n in too_long)
                + f": PostgreSQL keeps only the first {longest} bytes of a name (max_identifier_length), so the "
                "table can never have such a column (Spark's JDBC writer creates the cut name, writes once, then "
                "fails). Rename it in your select(...) (e.g. withColumnRenamed) to at most "
                f"{longest} bytes")
        existed = self._columns(conn, self.table) is not None
        misfit = [f"column {n!r} ({kind}) cannot take createTableColumnTypes' {mine}"
                  for n, kind in wanted if user_types and (mine := user_types.type_of(n)) is not None
                  and not compatible(kind, base_type(mine))]
        if misfit and not existed:  # refused before CREATE: no table is left behind that the query cannot write
            raise RegionalConfigError(
                f"target=postgres: {'; '.join(misfit)}. Give each column a type its values fit (e.g. VARCHAR(n) "
                "for a string, BIGINT for an int), or cast the column in your select(...)")
        have = self._create_missing(conn, self.table, created, options=self.settings.table_options)
        if not existed and self.settings.table_comment:
            conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(self.table.sql(),
                                                                     sql.Literal(self.settings.table_comment)))
        matched = match_columns([n for n, _k in wanted], list(have))
        problems = []
        for field, (name, kind) in zip(schema, wanted, strict=True):
            column = matched[name]
            if column is None:
                problems.append(f"column {name!r} ({kind}) is missing")
            elif not fits(field, have[column][0]):
                dated = base_type(kind).startswith("date") and have[column][0].startswith("timestamp with time zone")
                problems.append(f"column {column!r} is {have[column][0]}, the query writes {kind}"
                                + (": " + DATE_INTO_ZONED.format(column=name) if dated else ""))
        written = {c for c in matched.values() if c is not None}
        problems += [f"column {n!r} is NOT NULL without a default, and the query does not write it"
                     for n, (_k, required) in have.items() if required and n not in written]
        if problems:
            raise RegionalConfigError(
                f"target=postgres: table {self.table} does not fit the query: {'; '.join(problems)}. Alter the "
                "table, select(...) matching columns, or write to a new table (regional creates a missing one)")
        self.columns = {name: column for name, column in matched.items() if column is not None}
        self.json_columns = [f.name for f in schema if writes_json(f, have[self.columns[f.name]][0])]
        self.nested_columns = [f.name for f in schema if writes_multidimensional(f, have[self.columns[f.name]][0])]

    def task_options(self) -> dict[str, str]:
        """The table's column for each of the query's, and the arrays its tasks send as JSON."""
        if self.columns is None:
            return {}
        return {COLUMNS_KEY: json.dumps(self.columns), JSON_KEY: json.dumps(self.json_columns),
                NESTED_KEY: json.dumps(self.nested_columns)}

    # -- phase one, in the task -----------------------------------------------------------------

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> dict[str, Any] | None:
        import psycopg
        from psycopg import sql

        first = next(batches, None)
        if first is None:
            return None
        attempt = current_attempt()
        columns = self._table_columns(first.schema)
        # Not ``with conn``: its exit would COMMIT, which a prepared (two-phase) transaction refuses.
        conn = self._connect(autocommit=True)
        try:
            gid = str(Gid(self.query_id, epoch, region_key(region), uuid.uuid4().hex[:12], self._table_oid(conn),
                          attempt.run, attempt.partition, attempt.task))
            self._roll_back_dead_attempts(conn, epoch, region, attempt)  # their locks would block this one
            conn.autocommit = False
            if self.settings.isolation_level is not None:
                conn.isolation_level = psycopg.IsolationLevel[self.settings.isolation_level]
            conn.tpc_begin(gid)
            try:
                rows = self._copy(conn, self.table.sql(), columns, first, batches)
                with conn.cursor() as cur:
                    # The progress row's key is the gid: two attempts never wait for each other's row.
                    cur.execute(sql.SQL("INSERT INTO {} (query_id, region, epoch, gid, row_count) "
                                        "VALUES (%s, %s, %s, %s, %s)").format(self.commits.sql()),
                                (self.query_id, region, epoch, gid, rows))
                conn.tpc_prepare()
            except BaseException as exc:
                if not conn.closed:
                    conn.tpc_rollback()
                refused = self._refused(exc)
                if refused is None:
                    raise
                raise refused from exc
        finally:
            conn.close()
        return {"gid": gid, "rows": rows}

    def probe(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> None:
        """A probe's rows (records beside an isolated one: those before it are in the table already, so a unique
        key refuses them there): COPY into an empty temporary copy of the table, with its defaults, NOT NULL and
        CHECK constraints and unique indexes (LIKE ... INCLUDING ALL), then INSERT them into the table itself, rows
        it holds already skipped (ON CONFLICT DO NOTHING), for its triggers, row-level security and foreign keys;
        then roll back. The rows are checked as the table would check them, nothing is kept; a refusal raises
        ``RowsRejected`` as ``prepare`` does."""
        from psycopg import sql

        first = next(batches, None)
        if first is None:
            return None
        columns = self._table_columns(first.schema)
        conn = self._connect(autocommit=False)
        try:
            probe = sql.Identifier(f"regional_probe_{uuid.uuid4().hex[:12]}")
            conn.execute(sql.SQL("CREATE TEMPORARY TABLE {} (LIKE {} INCLUDING ALL) ON COMMIT DROP").format(
                probe, self.table.sql()))
            self._copy(conn, probe, columns, first, batches)
            # Then into the table itself, in this transaction, never committed: its triggers, row-level security
            # and foreign keys refuse the rows as they would refuse them now (a probe that skipped them would pass
            # while the table refuses every row, and the isolated record would look like poison). Rows it holds
            # already (a unique key) are skipped.
            self._probe_into_table(conn, probe, columns)
        except Exception as exc:
            refused = self._refused(exc)
            if refused is None:
                raise
            raise refused from exc
        finally:
            conn.close()  # never committed: the server rolls the transaction back, and drops its table with it
        return None

    def _probe_into_table(self, conn: Any, probe: Any, columns: list[str]) -> None:
        """INSERT the probe's rows from its temporary table ``probe`` into the table, in ``conn``'s transaction (never
        committed), skipping rows it holds already: ON CONFLICT DO NOTHING; where a deferrable unique or exclusion
        constraint refuses that (55000), a plain INSERT with constraints deferred (checked at a commit that never
        comes), and where a key that cannot be deferred still refuses rows held already, the table is not asked:
        the temporary copy's check stands (a trigger is then not run: the blind spot the docs name)."""
        from psycopg import errors, sql

        names = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        insert = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(self.table.sql(), names, names, probe)
        try:
            with conn.transaction():  # a savepoint
                conn.execute(insert + sql.SQL(" ON CONFLICT DO NOTHING"))
            return
        except errors.ObjectNotInPrerequisiteState:
            pass
        try:
            with conn.transaction():
                conn.execute("SET CONSTRAINTS ALL DEFERRED")
                conn.execute(insert)
        except (errors.UniqueViolation, errors.ExclusionViolation):
            pass

    def _table_columns(self, schema: pa.Schema) -> list[str]:
        """The table's column for each of the rows' columns (as open() matched them; else the rows' own names)."""
        return [(self.columns or {}).get(n, n) for n in schema.names]

    def _copy(self, conn: Any, table: Any, columns: list[str], first: pa.RecordBatch,
              batches: Iterator[pa.RecordBatch]) -> int:
        """COPY ``first`` and ``batches`` into ``table`` (a composed SQL name) in ``conn``'s transaction: rows
        copied."""
        from psycopg import sql

        encode = encoder(first.schema, self.json_columns, self.nested_columns)
        copy_sql = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
            table, sql.SQL(", ").join(sql.Identifier(c) for c in columns))
        rows = 0
        with conn.cursor() as cur, cur.copy(copy_sql) as copy:
            for batch in chain_first(first, batches):
                copy.write(encode(batch))
                rows += batch.num_rows
        return rows

    def _refused(self, exc: BaseException) -> RowsRejected | None:
        """``RowsInvalid`` for PostgreSQL's refusal of the rows for their own sake, ``RowsRejected`` for another
        refusal of these rows, None for anything else (the target's failure): ``rows_verdict``."""
        import psycopg

        if not isinstance(exc, psycopg.Error):
            return None
        state, diag = getattr(exc, "sqlstate", None) or "", exc.diag
        kind = rows_verdict(state, diag.constraint_name)
        if kind is None:
            return None
        # One line (the region's status shows a failure's last line): the message and its detail, not
        # PostgreSQL's CONTEXT (the COPY line, the whole row).
        why = " ".join(t.strip() for t in (diag.message_primary, diag.message_detail) if t) or str(exc)
        return kind(f"target=postgres: table {self.table} refused the rows (SQLSTATE {state}): "
                    f"{' '.join(why.split())}")

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
                                        if gid_epoch(gid, self.gid_prefix) <= up_to_epoch])
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


