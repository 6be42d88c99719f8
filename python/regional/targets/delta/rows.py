"""In the task: a Delta table's rules applied to one region's rows before they are written (``features.Rules``).

Generated columns the query leaves out are computed, and those it writes are checked (``col <=> expression``, as
delta-spark checks them); CHECK constraints, invariants and NOT NULL columns are checked, and a row that breaks
one is refused (``RowsInvalid``: the rows' own failure, never published). Column mapping: the file's columns get the
table's physical names and field ids (``PARQUET:field_id``), structs' fields too.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from regional.targets.base import RowsInvalid
from regional.targets.delta import sql
from regional.targets.delta.features import Rules, compile_check, compile_generated

FIELD_ID_KEY = b"PARQUET:field_id"


class RowRules:
    """``Rules`` compiled once per task for the query's schema ``query`` (the batches' schema)."""

    def __init__(self, rules: Rules, query: pa.Schema, where: str) -> None:
        self.rules = rules
        self.table = rules.arrow_schema() if rules.schema else query
        self.missing = [f for f in self.table if f.name not in query.names]  # left out (mergeSchema): null
        self.checks = [(what, text, compile_check(what, text, self.table, where)) for what, text in rules.checks]
        self.compute: list[tuple[pa.Field, sql.Expr]] = []
        for name, text in rules.generated:
            expr = compile_generated(name, text, self.table, where)
            if name in query.names:  # written by the query: it must equal the expression (null-safe)
                self.checks.append((f"generated column {name}", f"{name} <=> ({text})",
                                    sql.null_safe_equal(sql.Column(name, expr.kind), expr)))
            else:
                self.compute.append((self.table.field(name), expr))
        computed = {f.name for f, _ in self.compute}
        self.not_null = [n for n in rules.not_null if n in query.names or n in computed]
        self.mapping = {entry[0]: entry for entry in rules.mapping}

    def out_schema(self, query: pa.Schema) -> pa.Schema:
        """The rows' logical schema after the generated columns are added."""
        schema = query
        for column, _ in self.compute:
            schema = schema.append(column)
        return schema

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch with its generated columns, or ``RowsInvalid`` for its first row that breaks a rule. A NOT NULL
        column or a CHECK constraint is a function of the row alone (Delta refuses non-deterministic constraints),
        so a row that breaks one is the row's fault: the target's verdict, dead-lettered once isolated, without
        waiting for evidence (docs/dead-letters.md, "Your own verdict")."""
        rows = batch.num_rows
        columns: dict[str, Any] = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
        for f in self.missing:
            columns.setdefault(f.name, pa.nulls(rows, f.type))
        for column, expr in self.compute:
            value = sql.value_of(expr, columns, rows, column.type)
            columns[column.name] = value
            batch = batch.append_column(column, value)
        for name in self.not_null:
            nulls = batch.column(name).null_count
            if nulls:
                raise RowsInvalid(f"{nulls} of {rows} rows have null in column {name!r}, which is NOT NULL in "
                                   "the Delta table: they are refused (as delta-spark refuses them)")
        for what, text, expr in self.checks:
            held = sql.holds(expr, columns, rows)
            broken = rows - pc.sum(held).as_py() if rows else 0
            if broken:
                raise RowsInvalid(f"{broken} of {rows} rows break the Delta table's {what} ({text}): they are "
                                   "refused (as delta-spark refuses them)")
        return batch

    def file_schema(self, logical: pa.Schema) -> pa.Schema:
        """The schema of the Parquet file: physical names and field ids under column mapping."""
        if self.rules.mode == "none":
            return logical
        return pa.schema([_physical(f, self.mapping[f.name]) for f in logical], logical.metadata)

    def to_file(self, batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
        """The batch under the file's schema (a zero-copy view: only names and field metadata change)."""
        if schema is batch.schema:
            return batch
        return pa.RecordBatch.from_arrays([c.view(f.type) for c, f in zip(batch.columns, schema, strict=True)],
                                          schema=schema)


def _physical(f: pa.Field, entry: list[Any]) -> pa.Field:
    _, physical, ident, children = entry
    kind = f.type
    if children is not None and pa.types.is_struct(kind):
        by_name = {c[0]: c for c in children}
        kind = pa.struct([_physical(kind.field(i), by_name[kind.field(i).name]) for i in range(kind.num_fields)])
    return pa.field(physical, kind, f.nullable, {FIELD_ID_KEY: str(ident).encode()})
