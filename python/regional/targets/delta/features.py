"""The Delta protocol as regional's writer honours it: every table feature the table's protocol names is either
written with its rules (column mapping, CHECK constraints, invariants, generated columns, ...) or refused before
anything is staged, by name, saying what to do. A feature regional does not know is refused: it is never written
without its rules.

``table_rules`` reads the table's protocol, configuration and schema (on the driver, at open and at commit) into
``Rules``: what the tasks must do to the rows (check constraints and NOT NULL columns, compute generated columns,
write physical column names and field ids). ``Rules`` travel to the tasks as JSON; a table without any of these
gives empty rules, and the tasks then do nothing more than before.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from regional.errors import RegionalConfigError
from regional.targets.delta import sql

# Writer features regional writes with their rules (what it does for each: the docs' table).
SUPPORTED: dict[str, str] = {
    "appendOnly": "allowed: regional only appends",
    "invariants": "each column's `delta.invariants` expression is checked on the rows in the task, as a CHECK "
                  "constraint (rows that break it are rejected)",
    "checkConstraints": "every `delta.constraints.*` expression is checked on the rows in the task; a row that "
                        "breaks one is the row's failure (quarantined, dead-lettered when dead letters are on), "
                        "never published",
    "changeDataFeed": "allowed: regional's files are appends, which the change data feed reads as inserts",
    "generatedColumns": "a generated column the query leaves out is computed in the task; one the query writes "
                        "is checked against its expression, as delta-spark does",
    "columnMapping": "name and id modes: files hold the physical column names and field ids, partition values "
                     "are keyed by physical name",
    "deletionVectors": "allowed: appends carry no deletion vectors",
    "timestampNtz": "allowed: TIMESTAMP_NTZ columns are written as timestamps without time zone",
}
# Known features regional refuses, with what to do instead.
# delta-spark cannot drop these: the way out is another table.
_NEW_TABLE = ("delta-spark cannot drop this feature (DELTA_FEATURE_DROP_NONREMOVABLE_FEATURE): create a table without "
              "it and copy the rows into it with delta-spark (INSERT INTO new SELECT ... FROM old), or write to this "
              "table with delta-spark")
# Dropping typeWidening, v2Checkpoint or vacuumProtocolCheck adds it (delta-spark 4.x).
_PROTECTED = ("then ALTER TABLE ... DROP FEATURE checkpointProtection TRUNCATE HISTORY once the history is older "
              "than delta.logRetentionDuration (dropping it adds checkpointProtection, which delta-rs does not write "
              "either)")
REFUSED: dict[str, str] = {
    "rowTracking": "its writers must assign row ids and commit versions, which regional's commits do not. Drop it "
                   "with ALTER TABLE ... DROP FEATURE rowTracking, then ALTER TABLE ... DROP FEATURE "
                   "domainMetadata (setting 'delta.enableRowTracking' = 'false' leaves both in the protocol)",
    "domainMetadata": "regional's commits keep no domain metadata (row tracking and liquid clustering use it). Drop "
                      "it with ALTER TABLE ... DROP FEATURE domainMetadata (after DROP FEATURE rowTracking, which "
                      "leaves it in the protocol)",
    "clustering": "liquid clustering needs statistics and clustering metadata regional does not write. "
                  "CLUSTER BY NONE leaves the feature in the protocol, and " + _NEW_TABLE[0].lower() + _NEW_TABLE[1:],
    "identityColumns": "an identity column needs its high-water mark kept by every writer. " + _NEW_TABLE,
    "typeWidening": "delta-rs, which commits regional's files, does not write such tables. Drop it with ALTER "
                    "TABLE ... DROP FEATURE typeWidening, and " + _PROTECTED,
    "typeWidening-preview": "as typeWidening: ALTER TABLE ... DROP FEATURE `typeWidening-preview`, and " + _PROTECTED,
    "icebergCompatV1": "Iceberg metadata is kept in step by delta-spark's commits only. Write to a table without "
                       "UniForm",
    "icebergCompatV2": "Iceberg metadata is kept in step by delta-spark's commits only. Write to a table without "
                       "UniForm",
    "icebergWriterCompatV1": "Iceberg metadata is kept in step by delta-spark's commits only",
    "inCommitTimestamp": "its commits must carry monotonic in-commit timestamps, which delta-rs's do not. Drop it "
                         "with ALTER TABLE ... DROP FEATURE inCommitTimestamp (setting "
                         "'delta.enableInCommitTimestamps' = 'false' leaves it in the protocol)",
    "v2Checkpoint": "delta-rs, which commits regional's files, writes classic checkpoints. Drop it with ALTER "
                    "TABLE ... DROP FEATURE v2Checkpoint (setting 'delta.checkpointPolicy' = 'classic' leaves it "
                    "in the protocol), and " + _PROTECTED,
    "variantType": "regional does not write VARIANT columns (write the value as a string: to_json). " + _NEW_TABLE,
    "variantType-preview": "regional does not write VARIANT columns. " + _NEW_TABLE,
    "variantShredding-preview": "regional does not write VARIANT columns. " + _NEW_TABLE,
    "collations-preview": "regional compares strings by their bytes only. Write to a table without COLLATE",
    "checkpointProtection": "delta-rs, which commits regional's files, does not write such tables (delta-spark adds "
                            "it when typeWidening, v2Checkpoint or vacuumProtocolCheck is dropped). Drop it with "
                            "ALTER TABLE ... DROP FEATURE checkpointProtection TRUNCATE HISTORY once the table's "
                            "history is older than delta.logRetentionDuration, or copy the rows into a new table",
    "allowColumnDefaults": "column DEFAULT values are not applied by regional. " + _NEW_TABLE,
    "vacuumProtocolCheck": "not verified with regional's commits. Drop it with ALTER TABLE ... DROP FEATURE "
                           "vacuumProtocolCheck, and " + _PROTECTED,
}
# Features implied by a legacy writer version (below 7, without table features).
LEGACY_WRITER = [(2, "appendOnly"), (2, "invariants"), (3, "checkConstraints"), (4, "changeDataFeed"),
                 (4, "generatedColumns"), (5, "columnMapping"), (6, "identityColumns")]
READER_SUPPORTED = {"columnMapping", "deletionVectors", "timestampNtz"}
CHECK_PREFIX = "delta.constraints."
MAPPING_MODE = "delta.columnMapping.mode"
PHYSICAL = "delta.columnMapping.physicalName"
FIELD_ID = "delta.columnMapping.id"
GENERATED = "delta.generationExpression"
INVARIANTS = "delta.invariants"
IDENTITY = "delta.identity.start"
CHAR_VARCHAR = "__CHAR_VARCHAR_TYPE_STRING"  # a CHAR(n)/VARCHAR(n) column's declared type (Delta stores a string)
DEFAULT = "CURRENT_DEFAULT"


@dataclass
class Rules:
    """What a task must do to the rows of one epoch for this table. Empty for a table with none of it."""

    mode: str = "none"  # column mapping: none, name or id
    # per top-level column, logical name -> [physical name, field id, children as the same for a struct]
    mapping: list[list[Any]] = field(default_factory=list)
    checks: list[tuple[str, str]] = field(default_factory=list)  # (what it is, Spark SQL), a row must hold each
    not_null: list[str] = field(default_factory=list)  # logical top-level columns
    generated: list[tuple[str, str]] = field(default_factory=list)  # (column, Spark SQL)
    schema: str = ""  # the table's logical Arrow schema, base64 IPC (the tasks resolve columns against it)

    def __bool__(self) -> bool:
        return self.mode != "none" or bool(self.checks or self.not_null or self.generated)

    def to_json(self) -> str:
        return json.dumps({"mode": self.mode, "mapping": self.mapping, "checks": self.checks,
                           "not_null": self.not_null, "generated": self.generated, "schema": self.schema})

    @classmethod
    def from_json(cls, text: str) -> Rules:
        data = json.loads(text)
        return cls(data["mode"], data["mapping"], [tuple(c) for c in data["checks"]], data["not_null"],
                   [tuple(g) for g in data["generated"]], data["schema"])

    def digest(self) -> str:
        """What the rows were checked and written for (a table changed between open and commit differs)."""
        return hashlib.sha256(json.dumps([self.mode, self.mapping, self.checks, self.not_null,
                                          self.generated]).encode()).hexdigest()[:16]

    def arrow_schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(self.schema)))

    def physical_partition(self, logical: str) -> str:
        for entry in self.mapping:
            if entry[0] == logical:
                return str(entry[1])
        return logical


def writer_features(protocol: Any) -> list[str]:
    if protocol.min_writer_version >= 7:
        return list(protocol.writer_features or [])
    return [name for version, name in LEGACY_WRITER if protocol.min_writer_version >= version]


def table_rules(table: Any, where: str, query: pa.Schema | None, merge_schema: bool) -> Rules:
    """The rules for writing into ``table`` (a deltalake DeltaTable; ``where`` names it in errors), or
    RegionalConfigError naming the first feature regional cannot write with its rules, and what to do.
    ``query``: the query's logical Arrow schema, when known (the columns it leaves out)."""
    protocol = table.protocol()
    if protocol.min_reader_version > 3 or protocol.min_writer_version > 7:
        raise _refuse(where, f"Delta protocol reader version {protocol.min_reader_version}, writer version "
                             f"{protocol.min_writer_version}", "regional knows reader versions up to 3 and writer "
                             "versions up to 7. Write to a table of an older protocol")
    # A legacy protocol (writer version below 7) allows its version's features without using them: the table's
    # metadata says which are in use (an identity column, column mapping, ...), checked below.
    named = writer_features(protocol) if protocol.min_writer_version >= 7 else []
    # domainMetadata last: the feature that uses it (rowTracking, clustering) says more to the user.
    for name in sorted(named, key=lambda n: n == "domainMetadata"):
        if name in REFUSED:
            raise _refuse(where, f"the table feature {name!r}", REFUSED[name])
        if name not in SUPPORTED:
            raise _refuse(where, f"the table feature {name!r}", "regional does not know it, and never writes a "
                          "table without its rules. Write to a table without it, or with delta-spark")
    for name in (protocol.reader_features or []) if protocol.min_reader_version >= 3 else []:
        if name not in READER_SUPPORTED:
            raise _refuse(where, f"the reader feature {name!r}", REFUSED.get(name, "regional does not know it"))
    configuration = dict(table.metadata().configuration or {})
    fields = list(table.schema().fields)
    arrow = pa.schema(table.schema().to_arrow())
    rules = Rules()
    mode = (configuration.get(MAPPING_MODE) or "none").lower()
    if mode not in ("none", "name", "id"):
        raise _refuse(where, f"{MAPPING_MODE} = {mode!r}", "regional writes modes none, name and id")
    if mode != "none":
        rules.mode = mode
        rules.mapping = [_mapping(f, where) for f in fields]
        if merge_schema and query is not None and set(query.names) - set(arrow.names):
            raise _refuse(where, "mergeSchema adding columns to a table with column mapping",
                          "add the new columns first with delta-spark (ALTER TABLE ... ADD COLUMNS), then restart "
                          "the query without the new columns' merge")
    written = set(query.names) if query is not None else set(arrow.names)
    for f in fields:
        metadata = dict(f.metadata or {})
        if IDENTITY in metadata:
            raise _refuse(where, f"the identity column {f.name!r}", REFUSED["identityColumns"])
        if DEFAULT in metadata and f.name not in written:
            raise _refuse(where, f"the column {f.name!r} with a DEFAULT left out", REFUSED["allowColumnDefaults"])
        if GENERATED in metadata:
            rules.generated.append((f.name, str(metadata[GENERATED])))
        if INVARIANTS in metadata:
            rules.checks.append((f"invariant of {f.name}", _invariant(metadata[INVARIANTS], f.name, where)))
        if CHAR_VARCHAR in metadata:
            rules.checks.append(_length_limit(f.name, str(metadata[CHAR_VARCHAR]), where))
        if not f.nullable:
            rules.not_null.append(f.name)
    for key in sorted(configuration):
        if key.lower().startswith(CHECK_PREFIX):
            rules.checks.append((f"CHECK constraint {key[len(CHECK_PREFIX):]}", configuration[key]))
    for what, text in rules.checks:
        compile_check(what, text, arrow, where)
    for name, text in rules.generated:
        compile_generated(name, text, arrow, where)
    if rules:
        rules.schema = base64.b64encode(arrow.serialize().to_pybytes()).decode("ascii")
    return rules


def compile_check(what: str, text: str, arrow: pa.Schema, where: str) -> sql.Expr:
    try:
        expr = sql.parse(text, arrow)
    except sql.Unsupported as exc:
        raise _refuse(where, f"the {what} ({text})", f"regional cannot evaluate it with Spark's meaning ({exc}). "
                      "Write to this table with delta-spark, or drop the constraint") from None
    if expr.kind not in (sql.BOOLEAN, sql.NULL):
        raise _refuse(where, f"the {what} ({text})", "it is not a condition")
    return expr


def compile_generated(name: str, text: str, arrow: pa.Schema, where: str) -> sql.Expr:
    try:
        expr = sql.parse(text, arrow)
        result = expr.evaluate({f.name: pa.array([], f.type) for f in arrow}, 0)
        wanted = arrow.field(name).type
        if not isinstance(result, pa.Array) or result.type != wanted:
            got = result.type if isinstance(result, pa.Array | pa.Scalar) else "?"
            raise sql.Unsupported(f"it gives {got}, the column is {wanted}")
    except sql.Unsupported as exc:
        raise _refuse(where, f"the generated column {name!r} ({text})",
                      f"regional cannot compute it with Spark's meaning ({exc}). Write to this table with "
                      "delta-spark") from None
    return expr


def _mapping(f: Any, where: str) -> list[Any]:
    metadata = dict(f.metadata or {})
    physical, ident = metadata.get(PHYSICAL), metadata.get(FIELD_ID)
    if physical is None or ident is None:
        raise _refuse(where, f"column mapping without a physical name or id for {f.name!r}",
                      "the table's schema is incomplete; repair it with delta-spark")
    kind = f.type
    children = None
    if type(kind).__name__ == "StructType":
        children = [_mapping(c, where) for c in kind.fields]
    elif type(kind).__name__ in ("ArrayType", "MapType") and "Struct" in str(kind):
        raise _refuse(where, f"column mapping of the nested column {f.name!r} (a struct inside a list or map)",
                      "regional maps the names of top-level columns and of structs only. Write to this table "
                      "with delta-spark")
    return [f.name, str(physical), int(ident), children]


def _length_limit(column: str, declared: str, where: str) -> tuple[str, str]:
    """delta-spark's __CHAR_VARCHAR_STRING_LENGTH_CHECK__: a CHAR(n) or VARCHAR(n) value is null or at most n
    characters (delta-spark's writer neither pads nor trims them: it refuses a longer one)."""
    match = re.fullmatch(r"\s*(?:var)?char\s*\(\s*(\d+)\s*\)\s*", declared, re.IGNORECASE)
    if match is None:
        raise _refuse(where, f"the column {column!r} of type {declared}", "regional checks the length of top-level "
                      "CHAR/VARCHAR columns only. Write to this table with delta-spark, or make the nested "
                      "fields STRING")
    quoted = "`" + column.replace("`", "``") + "`"
    return (f"length limit of {column} ({declared})", f"{quoted} IS NULL OR length({quoted}) <= {match.group(1)}")


def _invariant(value: Any, column: str, where: str) -> str:
    try:
        data = json.loads(value) if isinstance(value, str) else value
        return str(data["expression"]["expression"])
    except (ValueError, KeyError, TypeError):
        raise _refuse(where, f"the invariant of {column!r} ({value})", "regional cannot read it") from None


def _refuse(where: str, what: str, todo: str) -> RegionalConfigError:
    return RegionalConfigError(f"the Delta table {where!r} has {what}: regional does not write it. {todo}")
