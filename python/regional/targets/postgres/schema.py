"""The table of ``target=postgres``: the column types Spark's JDBC writer creates (its PostgreSQL dialect), the
existing columns each Spark type may be written into, column names matched as Spark's JDBC writer matches them,
and ``createTableColumnTypes`` read as Spark reads it. Pure: no connection.

Types (``pg_type``), as ``df.write.jdbc`` creates them (PostgresDialect.getJDBCType, then JdbcUtils' common types):
string text, binary bytea, boolean boolean, tinyint and smallint smallint, int integer, bigint bigint, float real,
double double precision, decimal(p,s) numeric(p,s), date date, timestamp timestamp with time zone, timestamp_ntz
timestamp without time zone, array<x> of any of these x[], array<array<x>> x[] too. Spark's writer refuses maps,
structs and arrays of them ("Can't get JDBC type"); regional writes those as jsonb (``JSON_TYPE``), with Spark's
to_json conventions, and creates jsonb for an array of arrays too (``multidimensional_type`` says why).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from regional.errors import RegionalConfigError

JSON_TYPE = "jsonb"

# The scalar Arrow types Spark hands over -> the PostgreSQL type Spark's JDBC writer creates for them.
_SCALAR: dict[pa.DataType, str] = {
    pa.string(): "text", pa.large_string(): "text", pa.binary(): "bytea", pa.large_binary(): "bytea",
    pa.bool_(): "boolean", pa.int8(): "smallint", pa.int16(): "smallint", pa.int32(): "integer",
    pa.int64(): "bigint", pa.float32(): "real", pa.float64(): "double precision", pa.date32(): "date",
}
_FRACTIONS = {"numeric", "real", "double precision"}
_NUMBERS = {"smallint", "integer", "bigint"} | _FRACTIONS
# The existing column types each created type may be written into (the text COPY sends is valid input for all).
_COMPATIBLE: dict[str, set[str]] = {
    "text": {"text", "character varying", "character", "json", "jsonb", "uuid", "citext", "name", "xml", "inet",
             "cidr", "macaddr", "interval"},
    "bytea": {"bytea"},
    "boolean": {"boolean"},
    # Whole numbers go into any numeric column, as PostgreSQL's assignment casts take them from Spark's JDBC writer:
    # a value out of the column's range is that row's failure (SQLSTATE 22003), as it fails stock's INSERT. Fractions
    # never go into an integer column (stock's cast would round them; COPY refuses them).
    "smallint": _NUMBERS, "integer": _NUMBERS, "bigint": _NUMBERS, "real": _FRACTIONS,
    "double precision": _FRACTIONS,
    # Not timestamptz: Spark's JDBC writer lands a date there at midnight in its executors' JVM time zone, which
    # regional cannot know (and not in spark.sql.session.timeZone): refused, with a cast to give (DATE_INTO_ZONED).
    "date": {"date", "timestamp without time zone"},
    "timestamp with time zone": {"timestamp with time zone"},
    "timestamp without time zone": {"timestamp without time zone"},
    "numeric": _FRACTIONS,
    JSON_TYPE: {"jsonb", "json"},
}


DATE_INTO_ZONED = ("Spark's JDBC writer would land each date at midnight in its executors' JVM time zone, not in "
                   "spark.sql.session.timeZone, and regional cannot know that zone: cast it in your select(...) "
                   "(CAST({column} AS TIMESTAMP) is midnight in the session time zone), or make the column date")


def is_array(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def scalar_type(t: pa.DataType) -> str | None:
    """The PostgreSQL type of a scalar Arrow type, None for a nested one or one Spark's JDBC writer has none for."""
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp without time zone"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    return _SCALAR.get(t)


def pg_type(field: pa.Field) -> str:
    """The column type a missing table is created with for ``field``, as Spark's JDBC writer creates it (jsonb for
    what it refuses: maps, structs, arrays of those or of arrays)."""
    t = field.type
    if is_array(t):
        element = scalar_type(t.value_type)
        return JSON_TYPE if element is None and pa.types.is_nested(t.value_type) else _or_refuse(field, element) + "[]"
    if pa.types.is_nested(t):
        return JSON_TYPE
    return _or_refuse(field, scalar_type(t))


def _or_refuse(field: pa.Field, found: str | None) -> str:
    if found is None:
        raise RegionalConfigError(f"target=postgres: column {field.name!r} has type {field.type}, which Spark's JDBC "
                                  "writer has no PostgreSQL type for either; cast it in your select(...)")
    return found


def multidimensional_type(field: pa.Field) -> str | None:
    """For an array of arrays (of arrays ...) of a scalar: the PostgreSQL array type Spark's JDBC writer creates for
    it (``array<array<int>>``: ``integer[]``; PostgreSQL's array types have any number of dimensions); else None.
    regional creates jsonb for it (PostgreSQL's arrays must be rectangular, without null sub-arrays, and Spark's
    need not be), and writes it into an existing column of that type as Spark's JDBC writer does."""
    t = field.type
    if not (is_array(t) and is_array(t.value_type)):
        return None
    while is_array(t):
        t = t.value_type
    element = scalar_type(t)
    return None if element is None else element + "[]"


def writes_multidimensional(field: pa.Field, existing: str | None) -> bool:
    """Whether ``field``, an array of arrays, is written into ``existing``, an array column, as PostgreSQL's
    multidimensional array literal (``{{1,2},{3,NULL}}``)."""
    return existing is not None and existing.endswith("[]") and multidimensional_type(field) is not None


def writes_json(field: pa.Field, existing: str | None) -> bool:
    """Whether ``field`` is sent as JSON: what has no PostgreSQL type but jsonb (an array of arrays unless it goes
    into an existing array column), and an array written into an existing json or jsonb column (a table an earlier
    regional created, which wrote arrays as jsonb)."""
    if writes_multidimensional(field, existing):
        return False
    return pg_type(field) == JSON_TYPE or (is_array(field.type) and existing in ("json", "jsonb"))


def fits(field: pa.Field, existing: str) -> bool:
    """Whether a column of type ``existing`` takes ``field`` as regional writes it."""
    nested = multidimensional_type(field)
    return compatible(pg_type(field), existing) or (nested is not None and compatible(nested, existing))


def compatible(created: str, existing: str) -> bool:
    """Whether a column of type ``existing`` (format_type's spelling, no modifiers) takes what regional writes for
    a column it would create as ``created``."""
    if created.endswith("[]"):
        return existing in ("json", "jsonb") or (
            existing.endswith("[]") and compatible(created[:-2], existing[:-2]) and existing[:-2] not in ("json",
                                                                                                        "jsonb"))
    return existing in _COMPATIBLE[created.split("(")[0]]


def match_columns(wanted: list[str], have: list[str]) -> dict[str, str | None]:
    """Each of the query's column names -> the table's column it is written into (None: missing), matched as Spark's
    JDBC writer matches them with spark.sql.caseSensitive=false: without case (an exact match first, when a table
    has columns that differ only in case)."""
    matched: dict[str, str | None] = {}
    for name in wanted:
        if name in have:
            matched[name] = name
        else:
            matched[name] = next((h for h in have if h.lower() == name.lower()), None)
    return matched


@dataclass(frozen=True)
class ColumnTypes:
    """``createTableColumnTypes``: column -> the type text Spark's JDBC writer puts into CREATE TABLE."""

    types: dict[str, str]

    def type_of(self, column: str) -> str | None:
        """The user's type of ``column``, matched without case (as Spark does with caseSensitive=false)."""
        return next((t for c, t in self.types.items() if c.lower() == column.lower()), None)


# Spark SQL's type names -> the PostgreSQL type Spark's JDBC writer (its PostgreSQL dialect) puts into CREATE TABLE
# for them, in format_type's spelling (what ``compatible`` takes). Spark reads createTableColumnTypes as Spark types
# and maps each as it maps the query's own: ``ts TIMESTAMP`` is timestamptz, ``f FLOAT`` real, ``t TINYINT``
# smallint, ``s STRING`` text (seen on Spark 4, integration/test_postgres_like_jdbc.py).
_SPARK_TYPES = {
    "boolean": "boolean", "tinyint": "smallint", "byte": "smallint", "smallint": "smallint", "short": "smallint",
    "int": "integer", "integer": "integer", "bigint": "bigint", "long": "bigint", "float": "real", "real": "real",
    "double": "double precision", "date": "date", "timestamp": "timestamp with time zone",
    "timestamp_ltz": "timestamp with time zone", "timestamp_ntz": "timestamp without time zone", "string": "text",
    "binary": "bytea",
}
_ITEM = re.compile(r"\s*(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*)\s+(.+?)\s*$", re.S)
_SIZED = re.compile(r"(char|character|varchar)\s*\(\s*(\d+)\s*\)$", re.I)
_DECIMAL = re.compile(r"(?:decimal|dec|numeric)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?$", re.I)
_ARRAY = re.compile(r"array\s*<\s*(.+?)\s*>$", re.I | re.S)
_TAIL = re.compile(r"\s+(?:not\s+null|comment\s+'(?:[^'\\]|\\.)*')\s*$", re.I)


def parse_column_types(text: str, columns: list[str]) -> ColumnTypes:
    """``createTableColumnTypes`` (``"name VARCHAR(8), comments CHAR(64)"``), read as Spark's JDBC writer reads it:
    Spark SQL's column list syntax; each named column must be one of the query's (without case); each type goes into
    CREATE TABLE as Spark's PostgreSQL dialect maps it (``VARCHAR(8)`` -> ``character varying(8)``, ``INTEGER`` ->
    ``integer``, ``TIMESTAMP`` -> ``timestamp with time zone``, ``ARRAY<INT>`` -> ``integer[]``)."""
    types: dict[str, str] = {}
    for item in _split_top_level(text):
        found = _ITEM.fullmatch(item)
        if not found:
            raise RegionalConfigError(f"createTableColumnTypes: {item.strip()!r} is not 'column TYPE' (e.g. "
                                      "'name VARCHAR(8), comments CHAR(64)')")
        name = found.group(1)
        name = name[1:-1].replace("``", "`") if name.startswith("`") else name
        kind = found.group(2)
        while (tail := _TAIL.search(kind)) is not None:  # Spark's parser takes them; the DDL never carries them
            kind = kind[:tail.start()]
        if name.lower() in (c.lower() for c in types):
            raise RegionalConfigError(f"createTableColumnTypes names column {name!r} twice")
        if not any(c.lower() == name.lower() for c in columns):
            raise RegionalConfigError(f"createTableColumnTypes names column {name!r}, which the query does not write "
                                      f"(its columns: {', '.join(columns)})")
        types[name] = _postgres_type(name, kind.strip())
    return ColumnTypes(types)


def _postgres_type(column: str, kind: str, in_array: bool = False) -> str:
    if (simple := _SPARK_TYPES.get(kind.lower())) is not None:
        return simple
    if (sized := _SIZED.fullmatch(kind)) is not None:
        varying = sized.group(1).lower() == "varchar"
        return f"{'character varying' if varying else 'character'}({int(sized.group(2))})"
    if (decimal := _DECIMAL.fullmatch(kind)) is not None:
        precision = int(decimal.group(1) or 10)
        scale = int(decimal.group(2) or 0)
        if not 1 <= precision <= 38 or scale > precision:
            raise RegionalConfigError(f"createTableColumnTypes: column {column!r} has {kind}, which is not a Spark "
                                      "decimal (precision 1 to 38, scale at most the precision)")
        return f"numeric({precision},{scale})"
    if (array := _ARRAY.fullmatch(kind)) is not None and not in_array:
        return _postgres_type(column, array.group(1), in_array=True) + "[]"
    raise RegionalConfigError(f"createTableColumnTypes: column {column!r} has type {kind!r}, which is not a Spark SQL "
                              "scalar type or an array of one (Spark's JDBC writer takes Spark SQL types here, e.g. "
                              "VARCHAR(8), CHAR(3), INT, BIGINT, DECIMAL(10,2), DATE, TIMESTAMP, BOOLEAN, ARRAY<INT>)")


def base_type(kind: str) -> str:
    """A type without its modifiers, as ``compatible`` takes it: ``numeric(9,2)[]`` -> ``numeric[]``."""
    return re.sub(r"\([^)]*\)", "", kind)


def _split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside parentheses, angle brackets, backquotes and quotes."""
    items, depth, start, quote = [], 0, 0, ""
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "`'\"":
            quote = ch
        elif ch in "(<":
            depth += 1
        elif ch in ")>":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    if not text.strip() or any(not i.strip() for i in items):
        raise RegionalConfigError(f"createTableColumnTypes {text!r} has an empty column (e.g. 'name VARCHAR(8), "
                                  "comments CHAR(64)')")
    return items
