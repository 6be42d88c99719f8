"""What both dead-letter replays (``deadletter_table``: a table; ``deadletter_topic``: a topic) share: the plain
Arrow types they offer Spark, and the Spark DDL of their schema. Below both; imports neither.
"""

from __future__ import annotations

import pyarrow as pa

from regional.errors import RegionalConfigError


def sql_name(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def plain_type(f: pa.Field) -> pa.Field:
    """Delta's reader may hand out view or large types; the source offers Spark the plain ones."""
    return f.with_type(_plain(f.type))


def _plain(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(kind) or pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_binary_view(kind) or pa.types.is_large_binary(kind):
        return pa.binary()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
        return pa.list_(plain_type(kind.value_field))
    if pa.types.is_struct(kind):
        return pa.struct([plain_type(kind.field(i)) for i in range(kind.num_fields)])
    if pa.types.is_map(kind):
        return pa.map_(_plain(kind.key_type), _plain(kind.item_type))
    return kind


_SPARK_TYPES = {pa.string(): "STRING", pa.binary(): "BINARY", pa.bool_(): "BOOLEAN", pa.int8(): "TINYINT",
                pa.int16(): "SMALLINT", pa.int32(): "INT", pa.int64(): "BIGINT", pa.float32(): "FLOAT",
                pa.float64(): "DOUBLE", pa.date32(): "DATE"}


def spark_ddl(schema: pa.Schema) -> str:
    """The Spark DDL of an Arrow schema (the types a dead-letter table can hold)."""
    return ", ".join(f"{_ddl_name(f.name)} {_spark_type(f.type, f.name)}" for f in schema)


def _ddl_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _spark_type(kind: pa.DataType, name: str) -> str:
    if kind in _SPARK_TYPES:
        return _SPARK_TYPES[kind]
    if pa.types.is_timestamp(kind):
        return "TIMESTAMP" if kind.tz else "TIMESTAMP_NTZ"
    if pa.types.is_decimal(kind):
        return f"DECIMAL({kind.precision}, {kind.scale})"
    if pa.types.is_list(kind):
        return f"ARRAY<{_spark_type(kind.value_type, name)}>"
    if pa.types.is_map(kind):
        return f"MAP<{_spark_type(kind.key_type, name)}, {_spark_type(kind.item_type, name)}>"
    if pa.types.is_struct(kind):
        fields = (kind.field(i) for i in range(kind.num_fields))
        return "STRUCT<" + ", ".join(f"{_ddl_name(f.name)}: {_spark_type(f.type, name)}" for f in fields) + ">"
    raise RegionalConfigError(f"source=deadLetters: column {name!r} of the dead-letter table is {kind}, a type "
                              "the replay cannot hand to Spark")
