"""``target=postgres``, ``url=postgresql://user@host:port/db``, ``table=[schema.]table``.

Phase one (task): the region's rows are COPYed into the table, and a progress row goes into
``regional_commits`` (same schema as the table), in one transaction that is then ``PREPARE``d under a
gid naming the query, the epoch, the region and this attempt. Before that, the task rolls back the
prepared transactions of earlier attempts of the same region and epoch: only one attempt's message
reaches the driver, and an earlier one's locks (a unique key on the rows) would block this one.
Phase two (driver): ``COMMIT PREPARED`` for the published regions, ``ROLLBACK PREPARED`` for the rest.
A re-run after a crash commits nothing twice: a gid still in ``pg_prepared_xacts`` is committed, a gid
with a progress row was committed before, and a gid with neither is an error (its rows are gone).
Before each epoch's tasks run (``open``) the driver checks the server and the table, and ``sweep``
rolls back every prepared transaction of this query's recorded epochs: those of dead tasks and drivers.

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
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.csv as pacsv

from regional import failpoints
from regional.errors import RegionalConfigError, RegionalStoreError
from regional.targets.base import EpochReport, RegionalTarget, chain_first, require_query_id

COMMITS_TABLE = "regional_commits"
GID_PREFIX = "regional"
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
        """Check the server, create the table (from the rows' schema) and ``regional_commits`` if missing,
        and check an existing table's columns."""
        self._on_driver(lambda conn: self._open(conn, schema))

    def _open(self, conn: Any, schema: pa.Schema) -> None:
        from psycopg import sql

        (limit,) = conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
        if limit == 0:
            raise RegionalConfigError(
                f"target=postgres: the server at {_safe_url(self.url)} has max_prepared_transactions = 0, so it "
                "cannot PREPARE TRANSACTION. Set max_prepared_transactions (at least the number of regions per "
                "epoch, e.g. 64) in postgresql.conf and restart the server")
        index = sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (query_id, epoch)").format(
            sql.Identifier(f"{COMMITS_TABLE}_query_epoch"), self.commits.sql())
        self._create_missing(conn, self.commits, _COMMITS_COLUMNS, index)
        wanted = [(f.name, pg_type(f)) for f in schema]
        self._check_columns(self._create_missing(conn, self.table, wanted), wanted)

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
        attempts = f"{self.gid_prefix}{epoch}:{region_key(region)}:"  # this region's gids in this epoch
        gid = f"{attempts}{uuid.uuid4().hex[:12]}"
        # Not ``with conn``: its exit would COMMIT, which a prepared (two-phase) transaction refuses.
        conn = self._connect(autocommit=True)
        try:
            self._roll_back(conn, attempts)  # earlier attempts: their locks would block this one
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

    # -- phase two, on the driver -----------------------------------------------------------------

    def commit(self, epoch: int, handles: dict[str, Any], report: EpochReport | None = None) -> None:
        gids = {region: h["gid"] for region, h in handles.items() if h is not None}
        if gids:
            self._on_driver(lambda conn: self._commit(conn, epoch, gids))

    def _commit(self, conn: Any, epoch: int, gids: dict[str, str]) -> None:
        from psycopg import sql

        prepared = self._prepared(conn, f"{self.gid_prefix}{epoch}:")
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

    def abort(self, epoch: int, handles: dict[str, Any]) -> None:
        gids = {h["gid"] for h in handles.values() if isinstance(h, dict) and "gid" in h}
        if gids:
            self._on_driver(lambda conn: self._roll_back(conn, f"{self.gid_prefix}{epoch}:", only=gids))

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
            for gid in self._prepared(conn, self.gid_prefix):
                if _gid_epoch(gid, self.gid_prefix) <= up_to_epoch:
                    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            if self._columns(conn, self.commits) is not None:
                conn.execute(sql.SQL("DELETE FROM {} WHERE query_id = %s AND epoch < %s").format(self.commits.sql()),
                             (self.query_id, up_to_epoch - KEEP_PROGRESS_EPOCHS))

        self._on_driver(work)

    # -- helpers -----------------------------------------------------------------------------------

    @staticmethod
    def _prepared(conn: Any, prefix: str) -> set[str]:
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        return {gid for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (pattern,))}

    def _roll_back(self, conn: Any, prefix: str, only: set[str] | None = None) -> None:
        from psycopg import errors, sql

        for gid in self._prepared(conn, prefix):
            if only is None or gid in only:
                try:
                    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
                except errors.UndefinedObject:
                    pass  # rolled back by someone else meanwhile


_COMMITS_COLUMNS = [("query_id", "text NOT NULL"), ("region", "text NOT NULL"), ("epoch", "bigint NOT NULL"),
                    ("gid", "text PRIMARY KEY"), ("row_count", "bigint NOT NULL"),
                    ("prepared_at", "timestamp with time zone NOT NULL DEFAULT now()")]


def _gid_epoch(gid: str, prefix: str) -> int:
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
