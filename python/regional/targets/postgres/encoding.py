"""Arrow rows -> the CSV that ``COPY ... FROM STDIN (FORMAT csv)`` reads, value for value what Spark's JDBC writer
stores. Pure: no connection.

pyarrow's CSV writer does the plain columns (an unquoted empty field is NULL, every string is quoted; floats as
``nan``, ``inf``, ``-inf``, which PostgreSQL reads; decimals at full precision). Before it:

- a zoned timestamp (Spark's TimestampType arrives in the session time zone) is written as its UTC wall-clock time,
  which the COPY's session (TimeZone UTC) reads as the same instant: pyarrow formats a zoned timestamp in its zone
  with the offset cut to minutes, which put instants of a zone whose offset had seconds (local mean time) up to
  59 s early;
- a date or timestamp before year 1 is written with PostgreSQL's era: Spark's (proleptic Gregorian, ISO 8601)
  year 0 is PostgreSQL's 1 BC and year -45 its 46 BC (pyarrow writes them ``0000-12-30`` and ``-0045-10-29``,
  which PostgreSQL refuses or misreads), as Spark's JDBC writer lands them;
- binary becomes bytea's hex text;
- an array becomes a PostgreSQL array literal (``{"1.5","NaN"}``): every element quoted and escaped, NULL bare;
  computed with Arrow's kernels, not row by row;
- what goes to jsonb becomes JSON as Spark's to_json writes it: NaN and infinities as the strings ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"``, binary as base64, an empty map ``{}``, timestamps as UTC ISO 8601 instants,
  decimals as exact numbers; dates and timestamps before year 1 with ISO 8601's signed years (``-0045-10-29``).
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import math
import re
from collections.abc import Callable, Collection
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from regional.targets.postgres.schema import is_array

Converter = Callable[[pa.Array], pa.Array]

# 0001-01-01 00:00 (proleptic Gregorian, as Spark and PostgreSQL count), in days and seconds from 1970-01-01:
# what comes before is written with PostgreSQL's era (BC).
_YEAR_ONE_DAYS = -719162
_YEAR_ONE_SECONDS = -62135596800
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_ISO_YEAR = re.compile(r"(-?)(\d+)(-.*)", re.S)


def encoder(schema: pa.Schema, json_columns: Collection[str] = (),
            nested_columns: Collection[str] = ()) -> Callable[[pa.RecordBatch], bytes]:
    """The CSV of a batch of ``schema``; ``json_columns``: the arrays written into json or jsonb columns (maps,
    structs and arrays of them always are, arrays of arrays unless in ``nested_columns``: those written into
    array columns as PostgreSQL's multidimensional arrays)."""
    special = {i: convert for i, f in enumerate(schema)
               if (convert := converter(f.type, f.name in json_columns, f.name in nested_columns)) is not None}
    options = pacsv.WriteOptions(include_header=False)

    def encode(batch: pa.RecordBatch) -> bytes:
        for i, convert in special.items():
            batch = batch.set_column(i, batch.schema.field(i).name, convert(batch.column(i)))
        out = io.BytesIO()
        pacsv.write_csv(batch, out, options)
        return out.getvalue()

    return encode


def converter(t: pa.DataType, as_json: bool, multidimensional: bool = False) -> Converter | None:
    """How a column of type ``t`` is made CSV-ready; None: pyarrow writes it as it is."""
    if pa.types.is_timestamp(t):
        return _utc_with_eras if t.tz else _with_eras
    if pa.types.is_date32(t):
        return _with_eras
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return _hex
    if is_array(t) and not as_json and (multidimensional or not pa.types.is_nested(t.value_type)):
        return _array_literal
    if pa.types.is_nested(t):
        return _json_column
    return None


def _utc(column: pa.Array) -> pa.Array:
    """The same instants as UTC wall-clock times (no value changes: Arrow keeps zoned timestamps in UTC). The COPY's
    session runs with TimeZone UTC, so PostgreSQL reads them as the same instants; pyarrow formats these about 15
    times as fast as zoned ones."""
    return column.cast(pa.timestamp(column.type.unit))


def _utc_with_eras(column: pa.Array) -> pa.Array:
    return _with_eras(_utc(column))


def _with_eras(column: pa.Array) -> pa.Array:
    """Dates or timestamps without a zone as they are when all are from year 1 on (pyarrow writes those as
    PostgreSQL reads them); else as text, the ones before year 1 with PostgreSQL's era (``0001-12-30 BC``)."""
    early = pc.less(column, _year_one(column.type))
    if not pc.any(early).as_py():
        return column
    text = column.cast(pa.string())
    return pa.array([_bc(v) if e else v for v, e in zip(text.to_pylist(), early.to_pylist(), strict=True)],
                    pa.string())


def _year_one(t: pa.DataType) -> pa.Scalar:
    if pa.types.is_date32(t):
        return pa.scalar(_YEAR_ONE_DAYS, t)
    return pa.scalar(_YEAR_ONE_SECONDS * _PER_SECOND[t.unit], t)


def _bc(iso: str) -> str:
    """ISO 8601's year (0, -45: astronomical numbering, pyarrow's text) as PostgreSQL's era: ``0000-12-30`` ->
    ``0001-12-30 BC``, ``-0045-10-29 23:59:59`` -> ``0046-10-29 23:59:59 BC`` (PostgreSQL has no year 0)."""
    found = _ISO_YEAR.fullmatch(iso)
    assert found is not None, iso
    sign, year, rest = found.groups()
    return f"{1 - int(sign + year):04d}{rest} BC"


def _hex(column: pa.Array) -> pa.Array:
    return pa.array([None if v is None else "\\x" + v.hex() for v in column.to_pylist()], pa.string())


def _array_literal(column: pa.Array) -> pa.Array:
    """Each list as a PostgreSQL array literal: ``{"a","b \\"c\\"",NULL}``; a null list stays null. A list of
    lists as a multidimensional one, ``{{"1","2"},{"3",NULL}}``, as Spark's JDBC writer sends it (PostgreSQL
    refuses lists of different lengths and null lists inside: that row's own fault)."""
    offsets = column.offsets  # of this slice, into the whole array's values: rebased, with only its values
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    offsets = pc.subtract(offsets, pa.scalar(start, offsets.type))
    values = column.values.slice(start, end - start)
    if is_array(values.type):
        elements = pc.fill_null(_array_literal(values), "NULL")
    else:
        text = _element_text(values)
        escaped = pc.replace_substring(pc.replace_substring(text, "\\", "\\\\"), '"', '\\"')
        quoted = pc.binary_join_element_wise('"', escaped, '"', "")
        elements = pc.fill_null(quoted, "NULL")
    lists = type(column).from_arrays(offsets, elements, mask=column.is_null())
    joined = pc.binary_join(lists, ",")
    return pc.binary_join_element_wise("{", joined, "}", "")


def _element_text(values: pa.Array) -> pa.Array:
    """An array's elements as PostgreSQL reads them in an array literal (before quoting)."""
    t = values.type
    if pa.types.is_timestamp(t) and t.tz:
        values = _utc(values)
    if pa.types.is_timestamp(t) or pa.types.is_date32(t):
        return _with_eras(values).cast(pa.string())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return _hex(values)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return values.cast(pa.string())
    return values.cast(pa.string())  # numbers (nan, inf), booleans, decimals, dates, timestamps


def _json_column(column: pa.Array) -> pa.Array:
    t = column.type
    try:
        values = column.to_pylist()
    except (OverflowError, ValueError):  # a date or timestamp before year 1, which Python's datetime has not
        values = column.cast(_times_as(t, zoned=False)).cast(_times_as(t, zoned=True)).to_pylist()
    return pa.array([None if v is None else _json(v, t) for v in values], pa.string())


def _times_as(t: pa.DataType, zoned: bool) -> pa.DataType:
    """``t`` with its dates and timestamps as pyarrow's ISO 8601 text (``zoned``), or first its zoned timestamps
    without their zone (their UTC wall-clock times)."""
    if pa.types.is_timestamp(t):
        return pa.string() if zoned else pa.timestamp(t.unit)
    if pa.types.is_date32(t):
        return pa.string() if zoned else t
    if pa.types.is_map(t):
        return pa.map_(_times_as(t.key_type, zoned), _times_as(t.item_type, zoned))
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_times_as(t.field(i).type, zoned)) for i in range(t.num_fields)])
    if is_array(t):
        element = t.value_field.with_type(_times_as(t.value_type, zoned))
        return pa.large_list(element) if pa.types.is_large_list(t) else pa.list_(element)
    return t


def _json(value: Any, t: pa.DataType) -> str:
    """One value of Arrow type ``t`` as JSON text, as Spark's to_json writes it."""
    if value is None:
        return "null"
    if pa.types.is_map(t):
        items = ", ".join(f"{json.dumps(_key(k), ensure_ascii=False)}: {_json(v, t.item_type)}" for k, v in value)
        return "{" + items + "}"
    if pa.types.is_struct(t):
        fields = (t.field(i) for i in range(t.num_fields))
        return "{" + ", ".join(f"{json.dumps(f.name, ensure_ascii=False)}: {_json(value[f.name], f.type)}"
                               for f in fields) + "}"
    if is_array(t) or pa.types.is_fixed_size_list(t):
        return "[" + ", ".join(_json(v, t.value_type) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return '"NaN"'
        if math.isinf(value):
            return '"Infinity"' if value > 0 else '"-Infinity"'
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return json.dumps(base64.b64encode(value).decode("ascii"))
    if isinstance(value, str) and pa.types.is_timestamp(t):  # before year 1: pyarrow's text of its UTC time
        return json.dumps(value.replace(" ", "T") + ("Z" if t.tz else ""))
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            return json.dumps(value.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        return json.dumps(value.strftime("%Y-%m-%dT%H:%M:%S.%f"))
    if isinstance(value, dt.date):
        return json.dumps(value.isoformat())
    return json.dumps(str(value) if not isinstance(value, str) else value, ensure_ascii=False)


def _key(key: Any) -> str:
    """A map's key as a JSON object's name (its text, as to_json writes it)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    return json.loads(_json(key, pa.null())) if isinstance(key, (bytes, dt.date)) else str(key)
