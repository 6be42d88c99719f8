"""regional's evaluator of Delta CHECK constraints and generated columns (``targets/delta/sql.py``) against Spark
SQL itself, its reference (issue 46): random expressions of the subset sql.py claims (comparisons of every kind,
``<=>``, AND/OR/NOT with NULLs, IS [NOT] NULL, [NOT] IN, [NOT] BETWEEN, ``length`` of non-ASCII strings, integer,
decimal, string and date literals) over random rows (NULLs, extremes of every integer type, decimals, empty and
non-ASCII strings, dates, timestamps), evaluated by sql.py and by Spark's ``selectExpr`` in the one shared session,
compared value by value (true, false and null apart: a CHECK is broken by false and by null, see
test_delta_protocol's null row). An expression sql.py refuses is refused at open (the table is never written), so
only the accepted ones must agree; most must be accepted, or the test proves little.

Cheap: a few hundred expressions, a handful of Spark jobs.
"""

from __future__ import annotations

import datetime
import decimal
import random
from collections.abc import Callable

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from regional.targets.delta import sql

# (name, Spark type, Arrow type, kind)
COLUMNS = [
    ("i8", "TINYINT", pa.int8(), "number"), ("i16", "SMALLINT", pa.int16(), "number"),
    ("i32", "INT", pa.int32(), "number"), ("i64", "BIGINT", pa.int64(), "number"),
    ("d5", "DECIMAL(5,0)", pa.decimal128(5, 0), "number"), ("d10", "DECIMAL(10,2)", pa.decimal128(10, 2), "number"),
    ("d38", "DECIMAL(38,10)", pa.decimal128(38, 10), "number"),
    ("s", "STRING", pa.string(), "string"), ("Su", "STRING", pa.string(), "string"),
    ("b", "BOOLEAN", pa.bool_(), "boolean"), ("dt", "DATE", pa.date32(), "date"),
    ("ts", "TIMESTAMP", pa.timestamp("us", "UTC"), "timestamp"),
    ("ts2", "TIMESTAMP", pa.timestamp("us", "UTC"), "timestamp"),
]
STRINGS = ["", " ", "a", "A", "ab", "é", "e\u0301", "日本", "😀", "a😀", "ß", "\u00a0", "Z", "zz", "%", "_", "'",
           "BAD", "bad", "ab ", "\ufffd", "\uffff"]
DATES = [datetime.date(1, 1, 1), datetime.date(1969, 12, 31), datetime.date(1970, 1, 1), datetime.date(2024, 2, 29),
         datetime.date(9999, 12, 31)]
INT_RANGE = {"i8": 7, "i16": 15, "i32": 31, "i64": 63}
DEC = {"d5": (5, 0), "d10": (10, 2), "d38": (38, 10)}
UTC = datetime.timezone.utc


def random_value(rng: random.Random, name: str, kind: str) -> object:
    if rng.random() < 0.2:
        return None
    if name in INT_RANGE:
        bits = INT_RANGE[name]
        return rng.choice([0, 1, -1, 2**bits - 1, -(2**bits), rng.randint(-(2**bits), 2**bits - 1), rng.randint(-9, 9)])
    if name in DEC:
        precision, scale = DEC[name]
        digits = rng.choice([1, 3, precision])
        unscaled = rng.randint(-(10**digits) + 1, 10**digits - 1)
        return decimal.Decimal(unscaled).scaleb(-scale)
    if kind == "string":
        return rng.choice(STRINGS) + (rng.choice(STRINGS) if rng.random() < 0.3 else "")
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "date":
        return rng.choice(DATES)
    if kind == "timestamp":
        return datetime.datetime(rng.choice([1969, 1970, 2024]), 12, 31, 23, 59, 59, rng.choice([0, 1, 999999]),
                                 tzinfo=UTC)
    raise AssertionError(name)


class Expressions:
    """Random Spark SQL of sql.py's subset, well typed (each function returns an expression of one kind)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, *choices: Callable[[], str]) -> str:
        return self.rng.choice(choices)()

    def column(self, kind: str) -> str:
        names = [n for n, _, _, k in COLUMNS if k == kind]
        name = self.rng.choice(names)
        spelled = self.rng.choice([name, name.upper(), name.lower()])  # Spark resolves names case-insensitively
        return f"`{spelled}`" if self.rng.random() < 0.2 else spelled

    def null(self) -> str:
        return self.rng.choice(["NULL", "null"])

    def number(self, depth: int, literal: bool = False) -> str:
        rng = self.rng

        def integer() -> str:
            bits, suffix = rng.choice([(7, "Y"), (15, "S"), (31, ""), (63, "L"), (63, "")])
            value = rng.choice([0, 1, -1, 2, 2**bits - 1, -(2**bits), rng.randint(-100, 100)])
            text = str(abs(value)) + suffix
            space = " " if not suffix and rng.random() < 0.3 else ""  # "- 128Y" is minus an overflowing 128Y
            return f"-{space}{text}" if value < 0 else text

        def decimal_literal() -> str:
            whole = rng.choice(["0", "1", "12", "99999", "", "123456789012345678"])
            frac = rng.choice(["5", "50", "01", "", "999", "0000000001"])
            text = f"{whole}.{frac}" if whole or frac else "0.5"
            return ("-" + text) if rng.random() < 0.3 else text

        if literal:
            return self.pick(integer, decimal_literal)
        options = [lambda: self.column("number"), integer, decimal_literal]
        if depth > 0:
            options.append(lambda: f"{rng.choice(['length', 'LENGTH', 'char_length', 'character_length'])}("
                                   f"{self.string(depth - 1)})")
        if rng.random() < 0.05:
            return self.null()
        return self.pick(*options)

    def string(self, depth: int, literal_only: bool = False) -> str:
        rng = self.rng

        def literal() -> str:
            text = rng.choice(STRINGS)
            if "'" in text:
                return f'"{text}"'
            return f"'{text}'" if rng.random() < 0.8 else f'"{text}"'

        if literal_only:
            return literal()
        if rng.random() < 0.05:
            return self.null()
        return self.pick(lambda: self.column("string"), literal)

    def date(self, depth: int, literal: bool = False) -> str:
        if literal:
            return f"DATE '{self.rng.choice(DATES).isoformat()}'"
        if self.rng.random() < 0.05:
            return self.null()
        return self.pick(lambda: self.column("date"), lambda: f"DATE '{self.rng.choice(DATES).isoformat()}'")

    def timestamp(self, depth: int) -> str:
        return self.null() if self.rng.random() < 0.05 else self.column("timestamp")

    def value(self, kind: str, depth: int) -> str:
        if kind == "boolean":
            return f"({self.boolean(depth - 1)})" if depth > 0 else self.pick(
                lambda: self.column("boolean"), lambda: self.rng.choice(["TRUE", "false", "NULL"]))
        return str(getattr(self, kind)(depth))

    def boolean(self, depth: int) -> str:
        rng = self.rng
        kind = rng.choice(["number", "number", "string", "string", "date", "timestamp", "boolean"])

        def compare() -> str:
            op = rng.choice(["=", "==", "<>", "!=", "<", "<=", ">", ">=", "<=>"])
            return f"{self.value(kind, depth)} {op} {self.value(kind, depth)}"

        def is_null() -> str:
            return f"{self.value(kind, depth)} IS {rng.choice(['', 'NOT '])}NULL"

        def in_list() -> str:
            if kind not in ("number", "string", "date"):
                return compare()
            literal = getattr(self, kind)  # IN takes literals (and NULL) only here
            options = [self.null() if rng.random() < 0.1 else literal(0, True)
                       for _ in range(rng.randint(1, 4))]
            return f"{self.value(kind, depth)} {rng.choice(['', 'NOT '])}IN ({', '.join(options)})"

        def between() -> str:
            return (f"{self.value(kind, depth)} {rng.choice(['', 'NOT '])}BETWEEN {self.value(kind, depth)} AND "
                    f"{self.value(kind, depth)}")

        def logical() -> str:
            op = rng.choice(["AND", "OR", "and", "or"])
            return f"{self.boolean(depth - 1)} {op} {self.boolean(depth - 1)}"

        def negation() -> str:
            return f"{rng.choice(['NOT ', 'not ', '!'])}{self.boolean(depth - 1)}"

        def grouped() -> str:
            return f"({self.boolean(depth - 1)})"

        leaves = [compare, compare, is_null, in_list, between, lambda: self.column("boolean"),
                  lambda: rng.choice(["TRUE", "FALSE", "NULL"])]
        if depth <= 0:
            return rng.choice(leaves)()
        return rng.choice([*leaves, logical, logical, negation, grouped])()


def arrow_rows(rows: list[dict[str, object]]) -> dict[str, pa.Array]:
    return {name: pa.array([r[name] for r in rows], arrow) for name, _, arrow, _ in COLUMNS}


def ours(expr: sql.Expr, columns: dict[str, pa.Array], rows: int) -> list[object]:
    result = expr.evaluate(columns, rows)
    if isinstance(result, pa.Scalar):
        return [result.as_py()] * rows
    return result.to_pylist()


def spark_values(spark: SparkSession, texts: list[str], rows: list[dict[str, object]]) -> list[list[object]]:
    """Each expression's value on each row, by Spark (a batch in one job; an expression Spark refuses: None)."""
    schema = ", ".join(f"{name} {spark_type}" for name, spark_type, _, _ in COLUMNS)
    df = spark.createDataFrame([tuple(r[n] for n, *_ in COLUMNS) for r in rows], schema).coalesce(1)
    try:
        got = df.selectExpr(*[f"{t} AS e{i}" for i, t in enumerate(texts)]).collect()
        return [[row[i] for row in got] for i in range(len(texts))]
    except Exception:
        if len(texts) == 1:
            raise
        half = len(texts) // 2
        return spark_values(spark, texts[:half], rows) + spark_values(spark, texts[half:], rows)


@pytest.mark.parametrize("seed", [46, 4646])
def test_random_expressions_evaluate_as_spark_evaluates_them(spark, seed):
    rng = random.Random(seed)
    rows = [{name: random_value(rng, name, kind) for name, _, _, kind in COLUMNS} for _ in range(48)]
    rows.append(dict.fromkeys((n for n, *_ in COLUMNS), None))
    schema = pa.schema([(name, arrow) for name, _, arrow, _ in COLUMNS])
    columns = arrow_rows(rows)
    gen = Expressions(rng)
    texts = [gen.boolean(rng.randint(0, 3)) for _ in range(260)]
    texts += [gen.number(1) for _ in range(20)] + [gen.string(1) for _ in range(10)]
    accepted: list[tuple[str, sql.Expr]] = []
    refused: list[str] = []
    for text in texts:
        try:
            accepted.append((text, sql.parse(text, schema)))
        except sql.Unsupported:
            refused.append(text)
    assert len(accepted) >= 0.8 * len(texts), refused[:20]  # the subset is exercised, not refused wholesale
    want = spark_values(spark, [t for t, _ in accepted], rows)
    mismatches = []
    for (text, expr), theirs in zip(accepted, want, strict=True):
        got = ours(expr, columns, len(rows))
        for row, a, b in zip(rows, got, theirs, strict=True):
            if a != b or (type(a) is not type(b) and not (isinstance(a, int) and isinstance(b, int))):
                mismatches.append(f"{text}: regional {a!r}, Spark {b!r} on {row}")
                break
    assert not mismatches, "\n".join(mismatches[:10])
    checks = [e for t, e in accepted if e.kind in (sql.BOOLEAN, sql.NULL)]
    # holds() is the CHECK's verdict: true passes, false and null break it (as delta-spark's own inserts show).
    for (text, expr), theirs in zip(accepted, want, strict=True):
        if expr in checks:
            assert sql.holds(expr, columns, len(rows)).to_pylist() == [v is True for v in theirs], text


def test_what_sql_py_refuses_spark_reads_otherwise_or_not_at_all():
    """The refusals the fuzz leans on: floats (NaN orders above all in Spark), a decimal comparison whose common
    type passes 38 digits, a function or operator outside the subset. Each is Unsupported at open."""
    schema = pa.schema([("f", pa.float64()), ("d", pa.decimal128(38, 37)), ("n", pa.int64()), ("s", pa.string())])
    for text in ["f > 0", "d = n", "d < 10.5", "n + 1 > 0", "s LIKE 'a%'", "upper(s) = 'A'", "n = 1e3",
                 "CAST(n AS STRING) = '1'", "s = 'a' 'b'", "s = 'it\\'s'"]:
        with pytest.raises(sql.Unsupported):
            sql.parse(text, schema)
