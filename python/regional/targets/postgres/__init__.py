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

What lands is what Spark's JDBC writer (``df.write.jdbc``) writes: a missing table is created with the types its
PostgreSQL dialect chooses (``schema``), arrays as PostgreSQL arrays, NaN and infinities wherever a float can be,
timestamps as the exact instants, decimals at full precision (``encoding``); the query's columns are matched to an
existing table's without case, as Spark's writer matches them; Spark's JDBC options are honoured or refused by
name (``settings.OPTIONS``). Rows PostgreSQL refuses raise, after the attempt is rolled back, ``RowsInvalid`` when
the refusal is certainly the rows' own fault (a value a column will not take, a NOT NULL column, a CHECK constraint:
dead-lettered as soon as isolated) or ``RowsRejected`` when it is about them but perhaps not for their own sake (a
unique or foreign key, a trigger, row-level security: dead-lettered on evidence); ``target.rows_verdict`` and
docs/targets/postgres.md, "Errors about a row". The region is quarantined and, with dead letters on, the refused
record is isolated.

Modules: ``names`` (table, url, gids, attempts), ``settings`` (options), ``schema`` (types and DDL), ``encoding``
(Arrow to COPY's CSV), ``target`` (connections, the two phases, leftovers).
"""

from __future__ import annotations

from regional.targets.postgres.encoding import encoder
from regional.targets.postgres.names import (
    GID_PREFIX,
    Attempt,
    Gid,
    TableName,
    check_url,
    checkpoint_identity,
    current_attempt,
    gid_epoch,
    parse_table,
    region_key,
)
from regional.targets.postgres.schema import pg_type
from regional.targets.postgres.settings import OPTIONS, Settings
from regional.targets.postgres.target import COMMITS_TABLE, QUERIES_TABLE, PostgresTarget

__all__ = ["COMMITS_TABLE", "GID_PREFIX", "OPTIONS", "QUERIES_TABLE", "Attempt", "Gid", "PostgresTarget", "Settings",
           "TableName", "check_url", "checkpoint_identity", "create", "current_attempt", "encoder", "gid_epoch",
           "parse_table", "pg_type", "region_key"]


def create(options: dict[str, str]) -> PostgresTarget:
    return PostgresTarget(options)
