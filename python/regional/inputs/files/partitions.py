"""``source=files``: partition directories (``key=value``) inside a region, as columns of its records, named and
typed as Spark's partition discovery names and types them (``PartitioningUtils``, measured against Spark 4.2 in
docs/sources/files.md). Pure functions of file names: no I/O.

A file's partition values are the ``key=value`` directories on its path under its region, in order; plain
directories add none. Every file of every region shows the same keys, in the same order (compared ignoring case
would let ``Date`` and ``date`` name one column: they are refused instead). The columns (``PartitionColumns``) are
decided once, from the files present when the query is defined, and then fixed: a later file whose keys differ,
or whose value the column's type cannot hold, fails the query naming its directory (``PartitionColumns.check``);
a column never changes its type or goes null in silence.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from regional.dead_letters import DEAD_LETTER_COLUMNS, REPLAY_COLUMNS
from regional.errors import RegionalConfigError

NULL_VALUE = "__HIVE_DEFAULT_PARTITION__"  # Spark's (Hive's) name for a null partition value
RESERVED = ("region", "offset", "value")  # regional's own columns
TYPES = ("int", "bigint", "double", "date", "string")  # and decimal(p,0): what regional types a column as
_INT = re.compile(r"[+-]?\d+")  # Java's Integer.parseInt / Long.parseLong (and BigDecimal's integers)
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")  # java.math.BigDecimal(String)
_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?[fFdD]?"
                     r"|0[xX]([0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?\d+[fFdD]?)", re.ASCII)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)  # Spark's partition date format, yyyy-MM-dd
# What Spark may type TIMESTAMP (its pattern yyyy-MM-dd HH:mm:ss[.S], unescaped), widened to be refused rather
# than typed STRING where Spark might not; Spark 4.2 measured: a "T", or no seconds, is a STRING.
_TIMESTAMP = re.compile(r"\d{4}-\d{1,2}-\d{1,2} \d{1,2}:\d{1,2}:\d{1,2}.*", re.ASCII)
_HEX = re.compile(r"%([0-9a-fA-F]{2})")
INT_RANGE, LONG_RANGE = 1 << 31, 1 << 63


def unescape(text: str) -> str:
    """Hive's ``unescapePathName``, as Spark applies it to partition names and string values: each ``%XX`` is the
    character of code XX (``a%20b`` is ``a b``; ``%C3%A9`` is two characters, as in Spark)."""
    return _HEX.sub(lambda m: chr(int(m.group(1), 16)), text) if "%" in text else text


def _java_double(raw: str) -> float | None:
    """``Double.parseDouble`` (which trims characters up to the space first); None if Java refuses it."""
    text = raw.strip("".join(chr(c) for c in range(33)))
    if not _DOUBLE.fullmatch(text):
        return None
    if text.lstrip("+-").startswith(("0x", "0X")):
        body = text.rstrip("fFdD")
        return float.fromhex(body)
    return float(text.rstrip("fFdD").replace("Infinity", "inf"))


def infer_type(raw: str, typed: bool) -> str:
    """The Spark type of one raw value (the directory name's part after ``=``, still escaped), as
    ``inferPartitionColumnValue`` infers it: int, bigint, decimal(p,0), double, then date, else string; ``void``
    for ``__HIVE_DEFAULT_PARTITION__``. ``typed`` False: string (``partitionColumnTypeInference=false``)."""
    if raw == NULL_VALUE:
        return "void"
    if not typed:
        return "string"
    if _INT.fullmatch(raw):
        number = int(raw)
        if -INT_RANGE <= number < INT_RANGE:
            return "int"
        if -LONG_RANGE <= number < LONG_RANGE:
            return "bigint"
    if _DECIMAL.fullmatch(raw):  # BigDecimal(raw) of scale <= 0 (no fraction once the exponent is applied)
        # Spark's precision is BigDecimal's minus its scale: the unscaled digits (``0`` is one), then one per power
        # of ten of the exponent (``0e3`` is DECIMAL(4,0), as in Spark). Counted, never expanded: ``1e9999999999``
        # is a DOUBLE (Infinity), not ten billion digits in memory.
        sign_digits_exponent = Decimal(raw).as_tuple()
        exponent = int(sign_digits_exponent.exponent)
        digits = len(sign_digits_exponent.digits) + exponent
        if exponent >= 0 and digits <= 38:  # 38 digits at most (DecimalType's limit)
            return f"decimal({digits},0)"
    if _java_double(raw) is not None:
        return "double"
    if _TIMESTAMP.fullmatch(unescape(raw)):
        return "timestamp"  # refused by ``decide`` (regional does not type timestamps yet)
    if _DATE.fullmatch(raw):
        try:
            datetime.date.fromisoformat(raw)
            return "date"
        except ValueError:
            pass
    return "string"


def _decimal_digits(kind: str) -> int | None:
    if kind == "int":
        return 10
    if kind == "bigint":
        return 20
    if kind.startswith("decimal("):
        return int(kind[8:].split(",")[0])
    return None


def wider(a: str, b: str) -> str:
    """The type two values of one column take together, as Spark's ``findWiderTypeForPartitionColumn``."""
    if a == b:
        return a
    if a == "void" or b == "void":
        return b if a == "void" else a
    if {a, b} == {"int", "bigint"}:
        return "bigint"
    if {a, b} <= {"int", "bigint", "double"}:
        return "double"
    if (a.startswith("decimal(") or b.startswith("decimal(")) and "double" not in (a, b):
        da, db = _decimal_digits(a), _decimal_digits(b)
        if da is not None and db is not None:
            return f"decimal({max(da, db)},0)"
    return "string"


def dirs_of(name: str) -> list[tuple[str, str]]:
    """The partition directories on a file's path (its path under its region): (column, raw value) each."""
    return [(unescape(d.split("=", 1)[0]), d.split("=", 1)[1]) for d in name.split("/")[:-1] if "=" in d]


def arrow_type(kind: str) -> pa.DataType:
    if kind.startswith("decimal("):
        return pa.decimal128(int(kind[8:].split(",")[0]), 0)
    return {"int": pa.int32(), "bigint": pa.int64(), "double": pa.float64(), "date": pa.date32(),
            "string": pa.string()}[kind]


def ddl_type(kind: str) -> str:
    return {"int": "INT", "bigint": "BIGINT", "double": "DOUBLE", "date": "DATE", "string": "STRING"}.get(
        kind, kind.upper())


@dataclass(frozen=True)
class PartitionColumns:
    """The partition columns of a query: (name, type) in path order; empty: none (the read path is unchanged)."""

    columns: tuple[tuple[str, str], ...] = ()
    typed: bool = True  # partitionColumnTypeInference

    def __bool__(self) -> bool:
        return bool(self.columns)

    def to_json(self) -> list[list[str]]:
        return [[n, t] for n, t in self.columns]

    def describe(self) -> str:
        return ", ".join(f"{n} {ddl_type(t)}" for n, t in self.columns) or "no partition columns"

    def fields(self) -> list[pa.Field]:
        return [pa.field(n, arrow_type(t)) for n, t in self.columns]

    def ddl(self) -> str:
        return "".join(f", `{n.replace('`', '``')}` {ddl_type(t)}" for n, t in self.columns)

    def check(self, region: str, name: str, where: str, started_empty: bool) -> None:
        """Refuse a file whose partition directories do not fit the columns, naming its directory."""
        dirs = dirs_of(name)
        keys = tuple(k for k, _v in dirs)
        want = tuple(n for n, _t in self.columns)
        folder = "/".join(name.split("/")[:-1]) or "."
        if keys != want:
            shows = f"the partition directories {', '.join(keys)}" if keys else "no partition directory"
            if not want:
                then = ("restart the query: it has read no file yet, so it takes the partition columns of the "
                        "directories present then" if started_empty else "for their values as columns, a new "
                        "query (a new checkpointLocation and a new, empty target): a query that has read files "
                        "keeps its columns")
                raise RegionalConfigError(
                    f"source=files: {name!r} of region {region!r} under {where} is in the partition directory "
                    f"{folder!r}, but this query has no partition columns (none were found when it was defined): "
                    "its value would be in no record. Give .option('recursiveFileLookup', 'true') to read such "
                    "files without their directories' values (as Spark's text source does with that option); or, "
                    f"{then}")
            raise RegionalConfigError(
                f"source=files: {name!r} of region {region!r} under {where} shows {shows} (in {folder!r}), but "
                f"this query's partition columns are {', '.join(want)}, decided from the directories present when "
                "it started: every file must sit under one directory per column, in that order (a file directly "
                "in a region, or in a plain directory beside the partition directories, has no value for them). "
                "Move the file into partition directories of those keys (or out of path, or hide it with a "
                "leading '.'), or give .option('recursiveFileLookup', 'true') to a new query to read every file "
                "without partition columns")
        for (column, kind), (_k, raw) in zip(self.columns, dirs, strict=True):
            if not raw:
                raise RegionalConfigError(
                    f"source=files: {name!r} of region {region!r} under {where}: the partition directory "
                    f"'{column}=' has an empty value (Spark refuses it too: EMPTY_PARTITION_COLUMN_VALUE). Rename it "
                    f"(a null value is {column}={NULL_VALUE}, as Spark's writers name it), or hide it with a "
                    "leading '.'")
            # The value as Spark's inference types it, whatever partitionColumnTypeInference says: a column of
            # another type than STRING is the user's .schema(...), and Spark casts the value to it.
            fits = raw == NULL_VALUE or kind == "string" or wider(kind, infer_type(raw, True)) == kind
            if not fits:
                raise RegionalConfigError(
                    f"source=files: {name!r} of region {region!r} under {where}: its directory "
                    f"{column}={raw!r} holds a value that the partition column {column} ({ddl_type(kind)}, "
                    "inferred from the directories present when the query started) cannot hold, and a column "
                    "never changes its type in a running query. Rename or move the directory (or hide it with a "
                    "leading '.'), or read the column as it now infers in a new query (a new checkpointLocation "
                    "and a new, empty target; .option('partitionColumnTypeInference', 'false') types every "
                    "partition column as STRING)")

    def values(self, name: str) -> list[Any]:
        """A file's partition values, as Python values of the columns' types (None: null)."""
        out: list[Any] = []
        for (_column, kind), (_k, raw) in zip(self.columns, dirs_of(name), strict=True):
            out.append(None if raw == NULL_VALUE else _value(kind, raw))
        return out


def _value(kind: str, raw: str) -> Any:
    if kind in ("int", "bigint"):
        return int(raw)
    if kind.startswith("decimal("):
        return Decimal(raw).to_integral_value()
    if kind == "double":
        return _java_double(raw)
    if kind == "date":
        return datetime.date.fromisoformat(raw)
    return unescape(raw)


def decide(names: Iterable[tuple[str, str]], typed: bool, where: str) -> PartitionColumns:
    """The partition columns of the files ``names`` ((region, path under the region) each), as Spark's partition
    discovery decides them; a layout Spark refuses, or that regional cannot hold, is refused naming a file."""
    keys: tuple[str, ...] | None = None
    first = ("", "")
    kinds: list[str] = []
    for region, name in names:
        dirs = dirs_of(name)
        for column, raw in dirs:
            if not column:
                raise RegionalConfigError(
                    f"source=files: {name!r} of region {region!r} under {where}: a partition directory needs a "
                    f"column name before '=' (as in Spark). Rename the directory '={raw}'")
            if not raw:
                raise RegionalConfigError(
                    f"source=files: {name!r} of region {region!r} under {where}: the partition directory "
                    f"'{column}=' has an empty value (Spark refuses it too: EMPTY_PARTITION_COLUMN_VALUE). Name a "
                    f"null value {column}={NULL_VALUE}, as Spark's writers do")
        found = tuple(k for k, _v in dirs)
        if keys is None:
            keys, first = found, (region, name)
            lowered = [k.lower() for k in found]
            for column in found:
                if column.lower() in RESERVED:
                    raise RegionalConfigError(
                        f"source=files: {name!r} of region {region!r} under {where}: the partition directory "
                        f"'{column}=...' would be a column named like regional's own {column.lower()} column "
                        "(Spark's text source would replace its value column with it). Rename the directory")
                if column.lower() in DEAD_LETTER_COLUMNS + REPLAY_COLUMNS:
                    # Refused with or without dead letters: a restart may add deadLetterPath, and the columns are
                    # fixed for the query's life (a dead letter of such a record could never be written).
                    raise RegionalConfigError(
                        f"source=files: {name!r} of region {region!r} under {where}: the partition directory "
                        f"'{column}=...' would be a column named like the dead-letter table's own "
                        f"{column.lower()} column, so its records could never be dead-lettered. Rename the directory")
                if lowered.count(column.lower()) > 1:
                    raise RegionalConfigError(
                        f"source=files: {name!r} of region {region!r} under {where} shows the partition column "
                        f"{column} twice on its path (Spark refuses it too: COLUMN_ALREADY_EXISTS). Rename one of "
                        "the directories")
            kinds = ["void"] * len(found)
        elif found != keys:
            if [k.lower() for k in found] == [k.lower() for k in keys]:
                raise RegionalConfigError(
                    f"source=files: {name!r} (region {region!r}) and {first[1]!r} (region {first[0]!r}) under "
                    f"{where} spell the partition columns {', '.join(found)} and {', '.join(keys)}: give the "
                    "directories one spelling (Spark merges them under one of the two names)")
            raise RegionalConfigError(
                f"source=files: {name!r} (region {region!r}) and {first[1]!r} (region {first[0]!r}) under {where} "
                f"show different partition directories ({', '.join(found) or 'none'}; "
                f"{', '.join(keys) or 'none'}): every file of every region must sit under the same partition "
                "directories, in the same order, to give its records the same columns (Spark's text source "
                "refuses such a layout: CONFLICTING_DIRECTORY_STRUCTURES or CONFLICTING_PARTITION_COLUMN_NAMES). "
                "Move the files into one layout, or give .option('recursiveFileLookup', 'true') to read every file "
                "without partition columns")
        for i, (_column, raw) in enumerate(dirs):
            kinds[i] = wider(kinds[i], infer_type(raw, typed))
    columns = []
    for column, kind in zip(keys or (), kinds, strict=True):
        if kind == "timestamp":
            raise RegionalConfigError(
                f"source=files: the partition column {column} under {where} holds timestamps, which Spark types "
                "TIMESTAMP and regional does not type yet. Give .option('partitionColumnTypeInference', 'false') "
                "to read every partition column as STRING")
        columns.append((column, "string" if kind == "void" else kind))  # all null: Spark's void, no table's type
    return PartitionColumns(tuple(columns), typed)


def from_spark(fields: list[tuple[str, str]], typed: bool) -> PartitionColumns:
    """The partition columns of a schema Spark fixed (``.load()``'s, or the user's ``.schema(...)``): the fields
    after regional's three, with Spark's simple type names."""
    columns = []
    for name, kind in fields:
        kind = {"integer": "int", "long": "bigint"}.get(kind, kind)
        if kind not in TYPES and not re.fullmatch(r"decimal\(\d+,0\)", kind):
            raise RegionalConfigError(
                f"source=files: the column {name} {kind} of the given schema: regional types partition columns "
                "as INT, BIGINT, DECIMAL(p,0), DOUBLE, DATE or STRING. Give one of these (STRING holds any value)")
        columns.append((name, kind))
    return PartitionColumns(tuple(columns), typed)
