"""Per-file statistics of the add actions, as delta-spark writes them, so that its data skipping prunes regional's
files: ``numRecords``, and ``minValues``, ``maxValues``, ``nullCount`` of the table's indexed columns.

The indexed columns (``spec``, on the driver, from the table's metadata): the columns named by
``delta.dataSkippingStatsColumns`` if set, else the first ``delta.dataSkippingNumIndexedCols`` leaf columns
(default 32, -1 all), in the table's order, partition columns left out; keyed by physical name under column
mapping. In the task (``FileStats``), per file, from the very batches written (after generated columns are added):

- ``nullCount`` of every indexed leaf (a leaf under a null struct counts as null; a column the query leaves out is
  null in every row), min and max of the types delta-spark keeps them for: integers, decimals, floats, dates,
  timestamps and strings (booleans, binary, lists and maps: the null count only);
- strings: min is the first ``delta.dataSkippingStringPrefixLength`` (default 32) characters of the minimum, max
  is delta-spark's ``truncateMaxStringAgg`` of the maximum (a prefix in UTF-16 units, then U+007F or U+10FFFF as a
  tie-breaker greater than what was cut off, or no max past twice the prefix);
- timestamps: milliseconds, truncated (delta-spark's reader widens the max by 1 ms), ``Z``; without time zone, no
  suffix; floats: NaN is the greatest value (Spark's order), written ``"NaN"``, infinities ``"Infinity"``;
- ``tightBounds: true`` when the table supports deletion vectors.

A bound is never guessed: a value regional cannot place exactly (a type not listed) gets no min/max, which
delta-spark reads as "cannot skip". Pure: pyarrow only.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import struct
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

NUM_INDEXED = "delta.dataSkippingNumIndexedCols"
STATS_COLUMNS = "delta.dataSkippingStatsColumns"
PREFIX_LENGTH = "delta.dataSkippingStringPrefixLength"
PHYSICAL = "delta.columnMapping.physicalName"
DEFAULT_INDEXED = 32
DEFAULT_PREFIX = 32
ASCII_MAX = 0x7F
UTF8_MAX = (0xDBFF, 0xDFFF)  # U+10FFFF in UTF-16

# A spec: {"prefix": int, "tight": bool, "columns": [[logical, physical, children or None], ...]}; children are
# the indexed fields of a struct, in the same form. None columns: no column stats (numRecords only).
Spec = dict[str, Any]


def spec(schema_json: dict[str, Any], configuration: dict[str, str], partition_columns: list[str], mapped: bool,
         deletion_vectors: bool) -> Spec:
    """The indexed columns of a table (its Delta schema as JSON, its configuration), as delta-spark chooses them."""
    config = {k.lower(): v for k, v in configuration.items()}
    prefix = _int(config.get(PREFIX_LENGTH.lower()), DEFAULT_PREFIX)
    parts = {p.lower() for p in partition_columns}
    fields = [f for f in schema_json.get("fields", []) if f["name"].lower() not in parts]
    tree = [_node(f, mapped) for f in fields]
    named = config.get(STATS_COLUMNS.lower())
    columns: list[list[Any]] | None
    if named is not None:
        paths = _column_paths(named)
        columns = None if paths is None else _named(tree, paths)
    else:
        count = _int(config.get(NUM_INDEXED.lower()), DEFAULT_INDEXED)
        columns = tree if count < 0 else _first_leaves(tree, count)[0]
    return {"prefix": prefix, "tight": deletion_vectors, "columns": columns}


def table_spec(table: Any) -> Spec:
    """The spec of a deltalake DeltaTable as it is now."""
    metadata = table.metadata()
    configuration = dict(metadata.configuration or {})
    mode = next((v for k, v in configuration.items() if k.lower() == "delta.columnmapping.mode"), "none") or "none"
    protocol = table.protocol()
    features = set(protocol.writer_features or []) if protocol.min_writer_version >= 7 else set()
    return spec(json.loads(table.schema().to_json()), configuration, list(metadata.partition_columns),
                mode.lower() != "none", "deletionVectors" in features)


def default_spec(schema: pa.Schema) -> Spec:
    """A table regional creates with its first commit: default properties, the rows' columns."""
    return {"prefix": DEFAULT_PREFIX, "tight": False,
            "columns": _first_leaves([_arrow_node(f) for f in schema], DEFAULT_INDEXED)[0]}


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _node(field: dict[str, Any], mapped: bool) -> list[Any]:
    kind = field["type"]
    physical = str((field.get("metadata") or {}).get(PHYSICAL, field["name"])) if mapped else field["name"]
    children = [_node(c, mapped) for c in kind["fields"]] if isinstance(kind, dict) and kind.get("type") == "struct" \
        else None
    return [field["name"], physical, children]


def _arrow_node(field: pa.Field) -> list[Any]:
    children = [_arrow_node(field.type.field(i)) for i in range(field.type.num_fields)] \
        if pa.types.is_struct(field.type) else None
    return [field.name, field.name, children]


def _first_leaves(tree: list[list[Any]], count: int) -> tuple[list[list[Any]], int]:
    """delta-spark's truncateSchema: the first ``count`` leaves, structs cut inside."""
    taken, used = [], 0
    for name, physical, children in tree:
        if used >= count:
            break
        if children is not None:
            inner, n = _first_leaves(children, count - used)
            used += n
            taken.append([name, physical, inner])
        else:
            used += 1
            taken.append([name, physical, None])
    return taken, used


def _column_paths(text: str) -> list[list[str]] | None:
    """``a, b.c, `d e`.f`` as name parts, lower case (delta-spark matches them case-insensitively); None if
    unreadable (delta-spark then collects no column stats either)."""
    if not text.strip():
        return []
    paths: list[list[str]] = []
    token = re.compile(r"\s*(?:`((?:[^`]|``)*)`|([A-Za-z0-9_]+))\s*")
    at = 0
    while at < len(text):
        parts = []
        while True:
            match = token.match(text, at)
            if match is None:
                return None
            parts.append((match.group(1).replace("``", "`") if match.group(1) is not None else match.group(2)).lower())
            at = match.end()
            if at < len(text) and text[at] == ".":
                at += 1
                continue
            break
        paths.append(parts)
        if at < len(text):
            if text[at] != ",":
                return None
            at += 1
    return paths


def _named(tree: list[list[Any]], paths: list[list[str]]) -> list[list[Any]]:
    """delta-spark's filterSchema: the named columns (a struct named whole: all of it), in the table's order."""
    out = []
    for name, physical, children in tree:
        wanted = [p[1:] for p in paths if p and p[0] == name.lower()]
        if not wanted:
            continue
        if any(not rest for rest in wanted):
            out.append([name, physical, children])
        elif children is not None:
            out.append([name, physical, _named(children, wanted)])
    return out


# -- in the task -----------------------------------------------------------------------------------------------

def _eligible(kind: pa.DataType) -> bool:
    return (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
            or pa.types.is_date32(kind) or pa.types.is_timestamp(kind) or pa.types.is_string(kind)
            or pa.types.is_large_string(kind))


class _Leaf:
    """One indexed column's running null count, min and max over the batches of one file."""

    def __init__(self) -> None:
        self.nulls = 0
        self.low: Any = None
        self.high: Any = None
        self.nan = False
        self.kind: pa.DataType | None = None

    def add(self, values: pa.Array) -> None:
        self.nulls += values.null_count
        self.kind = values.type
        if not _eligible(values.type) or values.null_count == len(values):
            return
        if pa.types.is_floating(values.type):
            nan = pc.is_nan(values)
            if pc.any(nan).as_py():
                self.nan = True
                values = values.filter(pc.invert(nan))
                if not len(values):
                    return
        pair = pc.min_max(values)
        low, high = pair["min"], pair["max"]
        if pa.types.is_timestamp(values.type) or pa.types.is_date32(values.type):
            low, high = low.cast(pa.int64() if pa.types.is_timestamp(values.type) else pa.int32()), \
                high.cast(pa.int64() if pa.types.is_timestamp(values.type) else pa.int32())
        low, high = low.as_py(), high.as_py()
        if low is None:
            return
        self.low = low if self.low is None or low < self.low else self.low
        self.high = high if self.high is None or high > self.high else self.high


class FileStats:
    """The statistics of one file, fed the batches it holds (with the file's column names: physical ones under
    column mapping); ``to_json`` gives the add action's ``stats``."""

    def __init__(self, spec: Spec | None, schema: pa.Schema) -> None:
        self.spec = spec if spec is not None else default_spec(schema)
        self.rows = 0
        self.leaves: dict[tuple[str, ...], _Leaf] = {}
        self.present = _present(schema)

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        columns = self.spec["columns"]
        if not columns or not batch.num_rows:
            return
        by_name = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
        self._add(columns, by_name, ())

    def _add(self, columns: list[list[Any]], arrays: dict[str, pa.Array], path: tuple[str, ...]) -> None:
        for _, name, children in columns:  # the file's columns have the physical names
            values = arrays.get(name)
            if values is None:
                continue  # left out by the query: null in every row
            here = (*path, name)
            if children is not None:
                if not pa.types.is_struct(values.type):
                    continue
                fields = values.flatten()  # the struct's nulls are its fields' nulls, as Spark has them
                self._add(children, {values.type.field(i).name: f for i, f in enumerate(fields)}, here)
            else:
                self.leaves.setdefault(here, _Leaf()).add(values)

    def to_json(self) -> str:
        stats: dict[str, Any] = {"numRecords": self.rows}
        columns = self.spec["columns"]
        if columns:
            prefix = int(self.spec["prefix"])
            low = self._bounds(columns, (), lambda leaf: _low(leaf, prefix))
            high = self._bounds(columns, (), lambda leaf: _high(leaf, prefix))
            if low is not None:
                stats["minValues"] = low
                stats["maxValues"] = high
            stats["nullCount"] = self._nulls(columns, ())
        if self.spec.get("tight"):
            stats["tightBounds"] = True
        return _encode(stats)

    def _bounds(self, columns: list[list[Any]], path: tuple[str, ...], value: Any) -> dict[str, Any] | None:
        """The min (or max) object, or None where no indexed leaf under it is in the file with an eligible type
        (delta-spark then writes no entry; a struct of all-null values is ``{}``)."""
        out: dict[str, Any] = {}
        found = False
        for _, physical, children in columns:
            here = (*path, physical)
            if children is not None:
                inner = self._bounds(children, here, value)
                if inner is not None:
                    out[physical], found = inner, True
                continue
            leaf = self.leaves.get(here)
            kind = leaf.kind if leaf is not None else self.present.get(here)
            if kind is None or not _eligible(kind):
                continue
            found = True
            if leaf is not None:
                bound = value(leaf)
                if bound is not None:
                    out[physical] = bound
        return out if found else None

    def _nulls(self, columns: list[list[Any]], path: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for _, physical, children in columns:
            here = (*path, physical)
            if children is not None:
                out[physical] = self._nulls(children, here)
            else:
                leaf = self.leaves.get(here)
                out[physical] = leaf.nulls if leaf is not None else self.rows
        return out


def _present(schema: pa.Schema) -> dict[tuple[str, ...], pa.DataType]:
    """Every leaf of the file's schema by its path (a leaf of a file with no rows has its type still)."""
    out: dict[tuple[str, ...], pa.DataType] = {}

    def walk(field: pa.Field, path: tuple[str, ...]) -> None:
        here = (*path, field.name)
        if pa.types.is_struct(field.type):
            for i in range(field.type.num_fields):
                walk(field.type.field(i), here)
        else:
            out[here] = field.type

    for f in schema:
        walk(f, ())
    return out


def _low(leaf: _Leaf, prefix: int) -> Any:
    if leaf.low is None:
        return "NaN" if leaf.nan else None
    if isinstance(leaf.low, str):
        return leaf.low[:max(prefix, 0)]  # Spark's substring(min, 0, n): n characters (code points)
    return _json_value(leaf.low, leaf.kind)


def _high(leaf: _Leaf, prefix: int) -> Any:
    if leaf.nan:
        return "NaN"  # Spark orders NaN above every number
    if leaf.high is None:
        return None
    if isinstance(leaf.high, str):
        return truncate_max(leaf.high, prefix)
    return _json_value(leaf.high, leaf.kind)


def _json_value(value: Any, kind: pa.DataType | None) -> Any:
    assert kind is not None
    if pa.types.is_timestamp(kind):
        micros = value // 1000 if kind.unit == "ns" else value * {"s": 1_000_000, "ms": 1000, "us": 1}[kind.unit]
        try:  # milliseconds, truncated (floor), as delta-spark's timestamp format has them
            moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=micros // 1000)
        except OverflowError:
            return None
        text = f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d}"
        return text + ("Z" if kind.tz is not None else "")
    if pa.types.is_date32(kind):
        return (datetime.date(1970, 1, 1) + datetime.timedelta(days=value)).isoformat()
    if pa.types.is_decimal(kind):
        return _Raw(str(value))
    if pa.types.is_floating(kind):
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        if pa.types.is_float32(kind):
            return _Raw(_float32(value))
        return value
    return value


def _float32(value: float) -> str:
    """The shortest text that reads back as the same 32-bit float (as Java's Float.toString means it)."""
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == value:
            return text if any(c in text for c in ".en") else text + ".0"
    return repr(value)


class _Raw:
    """A number whose JSON text is given (a decimal's digits and scale; a float32's shortest text)."""

    def __init__(self, text: str) -> None:
        self.text = text


def _encode(value: Any) -> str:
    """Compact JSON, UTF-8 as delta-spark writes it, with ``_Raw`` numbers as their text."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_encode(str(k))}:{_encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, _Raw):
        return value.text
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def truncate_max(value: str, prefix: int) -> str | None:
    """delta-spark's ``truncateMaxStringAgg``: ``value`` cut to ``prefix`` UTF-16 units (never inside a surrogate
    pair), then a tie-breaker greater than what was cut off; None past twice the prefix."""
    units = _utf16(value)
    if len(units) <= prefix:
        return value
    if prefix <= 0:
        return None
    length = prefix + 1 if 0xD800 <= units[prefix - 1] <= 0xDBFF and 0xDC00 <= units[prefix] <= 0xDFFF else prefix
    while length <= 2 * prefix:
        if length >= len(units):
            return value
        if length + 1 < len(units) and (units[length], units[length + 1]) == UTF8_MAX:
            length += 2
        elif units[length] < ASCII_MAX:
            return _from_utf16(units[:length]) + chr(ASCII_MAX)
        else:
            return _from_utf16(units[:length]) + chr(0x10FFFF)
    return None


def _utf16(value: str) -> list[int]:
    data = value.encode("utf-16-le", "surrogatepass")
    return [data[i] | data[i + 1] << 8 for i in range(0, len(data), 2)]


def _from_utf16(units: list[int]) -> str:
    return b"".join(u.to_bytes(2, "little") for u in units).decode("utf-16-le", "surrogatepass")
