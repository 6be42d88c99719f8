"""Names of ``target=postgres``: the table (as SQL reads it), the url, the attempt running a task, the gids of
prepared transactions, a checkpoint's identity. Pure: no connection."""

from __future__ import annotations

import hashlib
import os
import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from regional.errors import RegionalConfigError

GID_PREFIX = "regional"


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
    """The libpq url of ``url`` (Spark's ``jdbc:postgresql://...`` is taken as the same url without ``jdbc:``),
    refused when it holds a password or a parameter libpq does not know."""
    if not url:
        raise RegionalConfigError("target=postgres needs .option('url', 'postgresql://user@host:port/database')")
    if url.lower().startswith("jdbc:"):
        url = url[len("jdbc:"):]
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise RegionalConfigError(f"target=postgres: url must start with postgresql:// (or Spark's "
                                  f"jdbc:postgresql://), got scheme {parts.scheme!r}")
    if parts.password is not None or "password=" in (parts.query or "").lower():
        raise RegionalConfigError(
            "target=postgres: the url holds a password, and sink options are logged by Spark. Remove it from the "
            "url and give it the libpq way: the PGPASSWORD environment variable (of the driver and the executors) "
            "or a ~/.pgpass file")
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # psycopg missing: the connection says so
        return url
    try:
        conninfo_to_dict(url)
    except Exception as exc:  # psycopg.ProgrammingError: libpq could not parse it
        raise RegionalConfigError(
            f"target=postgres: the url is not one libpq reads ({str(exc).strip().splitlines()[0]}). Parameters in "
            "its query string are libpq's (sslmode, connect_timeout, options, ...); the PostgreSQL JDBC driver's "
            "own properties (reWriteBatchedInserts, stringtype, ...) do not apply to regional's COPY") from None
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




def safe_url(url: str) -> str:
    """The url without its user (for messages): host, port and database."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5432}{parts.path}"


def gid_epoch(gid: str, prefix: str) -> int:
    """The epoch of one of this query's gids (``prefix``: ``regional:<query id>:``); -1 if unreadable."""
    try:
        return int(gid[len(prefix):].split(":", 1)[0])
    except ValueError:
        return -1
