"""The options of ``target=postgres``: regional's own, and every option of Spark's JDBC writer (``df.write.jdbc``)
with regional's answer, honoured with Spark's meaning or refused with what to do instead (``OPTIONS``); and
their reading (``Settings``). Pure: no connection."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from regional.errors import RegionalConfigError
from regional.options import Option, OptionTable
from regional.targets.postgres.names import TableName, check_url, parse_table

DEFAULT_ORPHAN_TIMEOUT = "1h"  # orphanTimeout: another query's leftovers are rolled back after this long idle
DEFAULT_LOCK_TIMEOUT = "60s"  # lockTimeout: PostgreSQL's lock_timeout for the tasks' COPY
ISOLATION_LEVELS = ("READ_UNCOMMITTED", "READ_COMMITTED", "REPEATABLE_READ", "SERIALIZABLE")

_READ_ONLY = "an option of Spark's JDBC reader; a target writes. Remove it"
_ONE_COPY = ("regional writes each region's slice with one COPY in its own transaction (no INSERT batches). "
             "Remove it")
_KERBEROS = ("regional connects with libpq, which takes Kerberos from the environment (KRB5CCNAME, a keytab "
             "through kinit) and `gssencmode`/`krbsrvname` in the url. Remove it")

OPTIONS = OptionTable("target=postgres", [
    Option("url", "required", "`postgresql://user@host:port/database` (libpq's url; Spark's "
                              "`jdbc:postgresql://...` is read as the same url). libpq parameters go in its query "
                              "string (`?sslmode=require`); never a password.", stock=True),
    Option("table", "required", "`table` or `schema.table` (SQL's rules: unquoted parts fold to lower case; "
                                "double-quote names with dots or capitals). Created, as Spark's JDBC writer creates "
                                "it, when missing."),
    Option("dbtable", "", "Spark's name for `table`: either one, not both.", stock=True),
    Option("user", "", "The user to connect as (else the url's, else libpq's default).", stock=True),
    Option("password", "", "", refused="sink options are logged by Spark and kept in the checkpoint: give the "
                                       "password the libpq way, the PGPASSWORD environment variable of the driver "
                                       "and the executors, or a ~/.pgpass file (PGPASSFILE)", stock=True),
    Option("driver", "", "Only `org.postgresql.Driver` (the only driver it could name): regional talks to the same "
                         "server through libpq.", stock=True),
    Option("createTableColumnTypes", "", "Column types for a table regional creates, in Spark's syntax "
                                         "(`\"name VARCHAR(8), code CHAR(3)\"`), as Spark's JDBC writer puts them "
                                         "into CREATE TABLE; the other columns get the default types.", stock=True),
    Option("createTableOptions", "", "Text appended to the CREATE TABLE of a table regional creates (e.g. "
                                     "`PARTITION BY ...`, `WITH (fillfactor=70)`), as Spark's JDBC writer does.",
           stock=True),
    Option("isolationLevel", "READ_UNCOMMITTED", "The transaction isolation level of each region's COPY: "
                                                 "`READ_UNCOMMITTED` (PostgreSQL runs it as READ COMMITTED), "
                                                 "`READ_COMMITTED`, `REPEATABLE_READ` or `SERIALIZABLE`. `NONE` "
                                                 "(no transaction) is refused: the prepared transaction is what "
                                                 "makes each region's slice exactly once.", stock=True),
    Option("queryTimeout", "0", "Seconds each statement of the tasks may run (PostgreSQL's statement_timeout); "
                                "0: no limit. A statement cut by it fails its region for the epoch (it falls back).",
           stock=True),
    Option("stringtype", "unspecified", "Only `unspecified`, what COPY always does: each value is text that the "
                                        "column's type reads (so strings go into uuid, json or enum columns).",
           stock=True),
    Option("truncate", "false", "Only `false`: Spark's JDBC writer truncates only in mode overwrite, which a "
                                "stream has not (it appends).", stock=True),
    Option("cascadeTruncate", "false", "Only `false`, as `truncate`.", stock=True),
    Option("batchsize", "", "", refused=_ONE_COPY, stock=True),
    Option("numPartitions", "", "", refused="each region's slice is written by its own task with its own "
                                            "connection; repartitioning would mix regions. Limit concurrent "
                                            "connections with the Spark cores of the query. Remove it", stock=True),
    Option("sessionInitStatement", "", "", refused=_READ_ONLY + " (run session settings through the url's "
                                                               "`options=-c name=value`, or ALTER ROLE ... SET)",
           stock=True),
    Option("query", "", "", refused=_READ_ONLY + "; name the table with `table`", stock=True),
    Option("prepareQuery", "", "", refused=_READ_ONLY, stock=True),
    Option("customSchema", "", "", refused=_READ_ONLY + "; cast the columns in your select(...), or give "
                                                       "createTableColumnTypes", stock=True),
    Option("partitionColumn", "", "", refused=_READ_ONLY, stock=True),
    Option("lowerBound", "", "", refused=_READ_ONLY, stock=True),
    Option("upperBound", "", "", refused=_READ_ONLY, stock=True),
    Option("fetchsize", "", "", refused=_READ_ONLY, stock=True),
    Option("pushDownPredicate", "", "", refused=_READ_ONLY, stock=True),
    Option("pushDownAggregate", "", "", refused=_READ_ONLY, stock=True),
    Option("pushDownLimit", "", "", refused=_READ_ONLY, stock=True),
    Option("pushDownOffset", "", "", refused=_READ_ONLY, stock=True),
    Option("pushDownTableSample", "", "", refused=_READ_ONLY, stock=True),
    Option("pushDownJoin", "", "", refused=_READ_ONLY, stock=True),
    Option("preferTimestampNTZ", "", "", refused=_READ_ONLY, stock=True),
    Option("hint", "", "", refused=_READ_ONLY, stock=True),
    Option("tableComment", "", "A comment on a table regional creates (COMMENT ON TABLE), as Spark's JDBC writer "
                               "sets it.", stock=True),
    Option("keytab", "", "", refused=_KERBEROS, stock=True),
    Option("principal", "", "", refused=_KERBEROS, stock=True),
    Option("refreshKrb5Config", "", "", refused=_KERBEROS, stock=True),
    Option("connectionProvider", "", "", refused="regional connects with libpq (psycopg), not through a JDBC "
                                                 "connection provider. Remove it", stock=True),
    Option("lockTimeout", DEFAULT_LOCK_TIMEOUT, "How long a task's COPY waits for a row lock (PostgreSQL's "
                                                "lock_timeout) before its region falls back for the epoch."),
    Option("orphanTimeout", DEFAULT_ORPHAN_TIMEOUT, "How long another query writing the same table may be idle "
                                                    "before regional rolls back the prepared transactions it left "
                                                    "(must exceed the longest epoch of any query on the table)."),
])


@dataclass(frozen=True)
class Settings:
    """The options, read and checked (keys lower-cased, as the sink hands them over)."""

    url: str
    table: TableName
    user: str | None
    lock_timeout: str
    orphan_timeout: str
    query_timeout_s: int
    isolation_level: str | None  # None: the server's default (READ COMMITTED)
    column_types: str | None  # createTableColumnTypes as given (checked against the schema at open)
    table_options: str
    table_comment: str | None

    @classmethod
    def of(cls, options: Mapping[str, str]) -> Settings:
        if "password" in options:
            raise RegionalConfigError("target=postgres: do not pass a 'password' option (sink options are logged and "
                                      "stored); use PGPASSWORD or ~/.pgpass, as libpq does")
        url = check_url(options.get("url"))
        if options.get("table") and options.get("dbtable"):
            raise RegionalConfigError("target=postgres: give 'table' or Spark's 'dbtable', not both")
        table = options.get("table") or options.get("dbtable")
        if not table:
            raise RegionalConfigError("target=postgres needs .option('table', 'schema.table')")
        driver = options.get("driver")
        if driver is not None and driver.strip() != "org.postgresql.Driver":
            raise RegionalConfigError(f"target=postgres: driver={driver!r}: regional writes to PostgreSQL through "
                                      "libpq; only 'org.postgresql.Driver' (or no driver option) is taken")
        for name in ("truncate", "cascadetruncate"):
            if options.get(name, "false").strip().lower() != "false":
                raise RegionalConfigError(
                    f"target=postgres: {name}={options[name]!r}: Spark's JDBC writer truncates only in mode "
                    "overwrite, and a streaming query appends. Remove it (truncate the table yourself before the "
                    "first start if that is what you want)")
        if options.get("stringtype", "unspecified").strip().lower() != "unspecified":
            raise RegionalConfigError(
                f"target=postgres: stringtype={options['stringtype']!r}: COPY always hands each value to the column's "
                "type as text, which is stringtype=unspecified; give that, or leave the option out")
        return cls(url=url, table=parse_table(table), user=options.get("user") or None,
                   lock_timeout=options.get("locktimeout", DEFAULT_LOCK_TIMEOUT),
                   orphan_timeout=options.get("orphantimeout", DEFAULT_ORPHAN_TIMEOUT),
                   query_timeout_s=_query_timeout(options.get("querytimeout", "0")),
                   isolation_level=_isolation_level(options.get("isolationlevel")),
                   column_types=options.get("createtablecolumntypes") or None,
                   table_options=options.get("createtableoptions", "").strip(),
                   table_comment=options.get("tablecomment") or None)


def _query_timeout(text: str) -> int:
    try:
        seconds = int(text.strip())
    except ValueError:
        seconds = -1
    if seconds < 0:
        raise RegionalConfigError(f"target=postgres: queryTimeout={text!r} must be a whole number of seconds, 0 or "
                                  "more (0: no limit), as Spark's JDBC option")
    return seconds


def _isolation_level(text: str | None) -> str | None:
    if text is None:
        return None
    level = text.strip().upper()
    if level == "NONE":
        raise RegionalConfigError("target=postgres: isolationLevel=NONE would write without a transaction, and each "
                                  "region's slice is exactly once only as one prepared transaction. Leave it out, "
                                  f"or give one of {', '.join(ISOLATION_LEVELS)}")
    if level not in ISOLATION_LEVELS:
        raise RegionalConfigError(f"target=postgres: isolationLevel={text!r} is not one of "
                                  f"{', '.join(ISOLATION_LEVELS)}")
    return level
