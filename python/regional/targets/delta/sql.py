"""The Spark SQL of a Delta table's CHECK constraints, invariants and generated columns, evaluated in the task over
an Arrow batch, with Spark's meaning.

A deliberately small language, evaluated exactly as Spark does: column references (case-insensitive, as Spark's
default resolution), literals (integers, decimals, strings without escapes, TRUE, FALSE, NULL, DATE '...'),
comparisons (``= == <> != < <= > >= <=>``) between values of one kind (numbers with numbers, strings with strings,
...), ``AND``, ``OR``, ``NOT`` (three-valued, as SQL's), ``IS [NOT] NULL``, ``[NOT] IN (literals)``,
``[NOT] BETWEEN``, and ``length``/``char_length``/``character_length`` of a string (Spark counts characters, as
Arrow's ``utf8_length`` does). Anything else (a function, arithmetic, a cast, floating-point comparisons, whose
NaN ordering differs from Spark's, a string literal with escapes) is ``Unsupported``: the target refuses the table
at open, naming the expression, rather than skip or guess a constraint.

Pure: pyarrow only.
"""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc


class Unsupported(ValueError):
    """An expression outside what regional evaluates with Spark's meaning."""


_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?[LlSsYyDd]?|\.\d+(?:[eE][+-]?\d+)?)
  | (?P<string>'[^'\\]*'(?!\s*')|"[^"\\]*"(?!\s*"))
  | (?P<quoted>`(?:[^`]|``)+`)
  | (?P<word>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<op><=>|==|<>|!=|<=|>=|[<>=(),.!-])
""", re.VERBOSE)

_COMPARE: dict[str, Callable[[object, object], pa.Array]] = {
    "=": pc.equal, "==": pc.equal, "<>": pc.not_equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal,
    ">": pc.greater, ">=": pc.greater_equal,
}
_LENGTH = {"length", "char_length", "character_length"}
_KEYWORDS = {"and", "or", "not", "is", "null", "in", "between", "true", "false", "date"}


def _tokens(text: str) -> list[tuple[str, str]]:
    out, at = [], 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None:
            raise Unsupported(f"cannot read {text[at:at + 20]!r}")
        at = match.end()
        kind = match.lastgroup or ""
        if kind != "space":
            out.append((kind, match.group()))
    return out


# -- the tree --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kind:
    """What kind of value an expression gives: ``number``, ``string``, ``boolean``, ``date``, ``timestamp`` or
    ``null`` (a bare NULL literal, which fits any kind)."""

    name: str


NUMBER, STRING, BOOLEAN, DATE, NULL = Kind("number"), Kind("string"), Kind("boolean"), Kind("date"), Kind("null")


def kind_of(arrow: pa.DataType) -> Kind | None:
    """The kind of an Arrow type, None for one no expression here may use (floats: Spark orders NaN as the
    largest value and equal to itself, Arrow does not; nested types)."""
    if pa.types.is_integer(arrow) or pa.types.is_decimal(arrow):
        return NUMBER
    if pa.types.is_string(arrow) or pa.types.is_large_string(arrow):
        return STRING
    if pa.types.is_boolean(arrow):
        return BOOLEAN
    if pa.types.is_date32(arrow):
        return DATE
    if pa.types.is_timestamp(arrow):
        return Kind(f"timestamp {arrow.tz or ''}".strip())
    return None


class Expr:
    kind: Kind

    def columns(self) -> set[str]:
        return set()

    def evaluate(self, columns: Mapping[str, pa.Array], rows: int) -> pa.Array | pa.Scalar:
        raise NotImplementedError


@dataclass
class Column(Expr):
    name: str  # the table's spelling
    kind: Kind

    def columns(self) -> set[str]:
        return {self.name}

    def evaluate(self, columns: Mapping[str, pa.Array], rows: int) -> pa.Array | pa.Scalar:
        return columns[self.name]


@dataclass
class Literal(Expr):
    value: pa.Scalar
    kind: Kind

    def evaluate(self, columns: Mapping[str, pa.Array], rows: int) -> pa.Array | pa.Scalar:
        return self.value


@dataclass
class Call(Expr):
    """An operator or function over its arguments, evaluated by ``apply``."""

    args: list[Expr]
    kind: Kind
    apply: Callable[..., pa.Array | pa.Scalar]

    def columns(self) -> set[str]:
        return set().union(*(a.columns() for a in self.args))

    def evaluate(self, columns: Mapping[str, pa.Array], rows: int) -> pa.Array | pa.Scalar:
        return self.apply(*(a.evaluate(columns, rows) for a in self.args))


# -- the parser ------------------------------------------------------------------------------------------------

class _Parser:
    def __init__(self, text: str, schema: pa.Schema) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.at = 0
        self.fields = {f.name.lower(): f for f in schema}
        if len(self.fields) != len(schema):
            raise Unsupported("the table has columns whose names differ in case only")

    def peek(self, offset: int = 0) -> tuple[str, str]:
        i = self.at + offset
        return self.tokens[i] if i < len(self.tokens) else ("end", "")

    def word(self, offset: int = 0) -> str:
        kind, text = self.peek(offset)
        return text.lower() if kind == "word" else ""

    def take(self, text: str) -> None:
        got = self.peek()[1]
        if got.lower() != text:
            raise Unsupported(f"expected {text!r} at {got or 'the end'!r}")
        self.at += 1

    def parse(self) -> Expr:
        expr = self.disjunction()
        if self.peek()[0] != "end":
            raise Unsupported(f"cannot read from {self.peek()[1]!r}")
        return expr

    def disjunction(self) -> Expr:
        left = self.conjunction()
        while self.word() == "or":
            self.at += 1
            left = _logical("or", left, self.conjunction())
        return left

    def conjunction(self) -> Expr:
        left = self.negation()
        while self.word() == "and":
            self.at += 1
            left = _logical("and", left, self.negation())
        return left

    def negation(self) -> Expr:
        if self.word() == "not" or self.peek()[1] == "!":
            self.at += 1
            inner = self.negation()
            _need(inner, BOOLEAN, "NOT")
            return Call([inner], BOOLEAN, lambda value: pc.invert(_typed(value, pa.bool_())))
        return self.predicate()

    def predicate(self) -> Expr:
        left = self.operand()
        kind, text = self.peek()
        if kind == "op" and text in _COMPARE:
            self.at += 1
            return _compare(text, left, self.operand())
        if kind == "op" and text == "<=>":
            self.at += 1
            return null_safe_equal(left, self.operand())
        negated = self.word() == "not" and self.word(1) in ("in", "between")
        if negated:
            self.at += 1
        if self.word() == "is":
            self.at += 1
            is_not = self.word() == "not"
            self.at += is_not
            self.take("null")
            return Call([left], BOOLEAN, pc.is_valid if is_not else pc.is_null)
        if self.word() == "in":
            self.at += 1
            self.take("(")
            options = [self.operand()]
            while self.peek()[1] == ",":
                self.at += 1
                options.append(self.operand())
            self.take(")")
            found = _in(left, options)
            return Call([found], BOOLEAN, pc.invert) if negated else found
        if self.word() == "between":
            self.at += 1
            low = self.operand()
            self.take("and")
            high = self.operand()
            inside = _logical("and", _compare(">=", left, low), _compare("<=", left, high))
            return Call([inside], BOOLEAN, pc.invert) if negated else inside
        if negated:
            raise Unsupported("NOT must be followed by IN or BETWEEN here")
        return left

    def operand(self) -> Expr:
        kind, text = self.peek()
        self.at += 1
        if kind == "op" and text == "(":
            inner = self.disjunction()
            self.take(")")
            return inner
        if kind == "number":
            return _number(text)
        if kind == "op" and text == "-" and self.peek()[0] == "number":  # a negative literal
            self.at += 1
            return _number("-" + self.tokens[self.at - 1][1])
        if kind == "string":
            return Literal(pa.scalar(text[1:-1], pa.string()), STRING)
        if kind == "quoted":
            return self.column(text[1:-1].replace("``", "`"))
        if kind == "word":
            lowered = text.lower()
            if lowered in ("true", "false"):
                return Literal(pa.scalar(lowered == "true"), BOOLEAN)
            if lowered == "null":
                return Literal(pa.scalar(None, pa.null()), NULL)
            if lowered == "date" and self.peek()[0] == "string":
                return _date(self.tokens[self.at][1][1:-1], self)
            if self.peek()[1] == "(":
                return self.call(lowered)
            if lowered in _KEYWORDS:
                raise Unsupported(f"{text} is not read here")
            return self.column(text)
        raise Unsupported(f"cannot read {text or 'the end'!r}")

    def column(self, name: str) -> Expr:
        if self.peek()[1] == ".":
            raise Unsupported(f"a nested field ({name}.{self.peek(1)[1]})")
        field = self.fields.get(name.lower())
        if field is None:
            raise Unsupported(f"no column {name!r} in the table")
        kind = kind_of(field.type)
        if kind is None:
            raise Unsupported(f"column {field.name!r} is {field.type}: regional compares no such values")
        return Column(field.name, kind)

    def call(self, function: str) -> Expr:
        if function not in _LENGTH:
            raise Unsupported(f"the function {function}()")
        self.take("(")
        arg = self.disjunction()
        self.take(")")
        _need(arg, STRING, function)
        return Call([arg], NUMBER, lambda value: pc.cast(pc.utf8_length(_typed(value, pa.string())), pa.int32()))


def _need(expr: Expr, kind: Kind, where: str) -> None:
    if expr.kind not in (kind, NULL):
        raise Unsupported(f"{where} of a {expr.kind.name} value")


def _logical(op: str, left: Expr, right: Expr) -> Expr:
    _need(left, BOOLEAN, op.upper())
    _need(right, BOOLEAN, op.upper())
    function = pc.and_kleene if op == "and" else pc.or_kleene
    return Call([left, right], BOOLEAN, lambda a, b: function(_typed(a, pa.bool_()), _typed(b, pa.bool_())))


def _typed(value: object, arrow: pa.DataType) -> object:
    """A bare NULL as a null of the type the operator takes (Arrow's kernels have none for the null type; SQL's
    NULL AND x, NOT NULL, length(NULL) are null of their operator's type)."""
    return pa.scalar(None, arrow) if _is_null_scalar(value) else value


def _same_kind(op: str, left: Expr, right: Expr) -> None:
    if NULL in (left.kind, right.kind):
        return
    if left.kind != right.kind:
        raise Unsupported(f"{op} of a {left.kind.name} and a {right.kind.name} value (Spark would cast one)")


def _compare(op: str, left: Expr, right: Expr) -> Expr:
    _same_kind(op, left, right)
    function = _COMPARE[op]
    return Call([left, right], BOOLEAN, lambda a, b: _null_if_null(function, a, b))


def _null_if_null(function: Callable[[object, object], pa.Array], a: object, b: object) -> pa.Array:
    if _is_null_scalar(a) or _is_null_scalar(b):  # Arrow has no comparison with the null type: the answer is null
        other = b if _is_null_scalar(a) else a
        return pa.nulls(len(other), pa.bool_()) if isinstance(other, pa.Array) else pa.scalar(None, pa.bool_())
    return function(a, b)


def _is_null_scalar(value: object) -> bool:
    return isinstance(value, pa.Scalar) and pa.types.is_null(value.type)


def null_safe_equal(left: Expr, right: Expr) -> Expr:
    _same_kind("<=>", left, right)

    def apply(a: object, b: object) -> pa.Array:
        equal = pc.fill_null(_null_if_null(pc.equal, a, b), False)
        both_null = pc.and_(_nulls(a), _nulls(b))
        return pc.or_(equal, both_null)

    return Call([left, right], BOOLEAN, apply)


def _nulls(value: object) -> pa.Array | pa.Scalar:
    if _is_null_scalar(value):
        return pa.scalar(True)
    return pc.is_null(value)


def _in(left: Expr, options: list[Expr]) -> Expr:
    """``x IN (a, b)`` as Spark has it: ``x = a OR x = b`` (true if one matches, else null if x or an option is
    null, else false)."""
    result: Expr | None = None
    for option in options:
        if option.columns():
            raise Unsupported("IN with a column among its values")
        equal = _compare("=", left, option)
        result = equal if result is None else _logical("or", result, equal)
    assert result is not None
    return result


def _number(text: str) -> Literal:
    suffix = text[-1].lower() if text[-1].isalpha() else ""
    body = text[:-1] if suffix else text
    if suffix in ("d",) or "e" in body.lower() or (suffix == "" and "." in body and "e" in body.lower()):
        raise Unsupported(f"the floating-point literal {text}")
    if "." in body:
        value = decimal.Decimal(body)
        exponent = value.as_tuple().exponent
        scale = -exponent if isinstance(exponent, int) and exponent < 0 else 0
        digits = max(len(value.as_tuple().digits), scale, 1)
        if digits > 38:
            raise Unsupported(f"the literal {text}")
        return Literal(pa.scalar(value, pa.decimal128(digits, scale)), NUMBER)
    number = int(body)
    if not -(2**63) <= number < 2**63:
        raise Unsupported(f"the literal {text}")
    return Literal(pa.scalar(number, pa.int64()), NUMBER)


def _date(text: str, parser: _Parser) -> Literal:
    parser.at += 1
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        raise Unsupported(f"DATE {text!r} (regional reads DATE 'yyyy-mm-dd' only)")
    try:
        value = datetime.date.fromisoformat(text)
    except ValueError as exc:
        raise Unsupported(f"DATE {text!r}: {exc}") from None
    return Literal(pa.scalar(value, pa.date32()), DATE)


def parse(text: str, schema: pa.Schema) -> Expr:
    """The expression ``text`` over the columns of ``schema`` (the table's logical Arrow schema), or
    ``Unsupported`` saying what regional cannot evaluate with Spark's meaning."""
    try:
        expr = _Parser(text, schema).parse()
        # Evaluated once over no rows: an operation Arrow has no kernel for (a comparison of decimals whose common
        # type passes 38 digits, where Spark would round or fail) is refused here, at open, never met in a task.
        expr.evaluate({f.name: pa.array([], f.type) for f in schema}, 0)
        return expr
    except Unsupported:
        raise
    except (pa.ArrowException, ValueError, decimal.InvalidOperation) as exc:
        raise Unsupported(str(exc)) from None


def holds(expr: Expr, columns: Mapping[str, pa.Array], rows: int) -> pa.Array:
    """Whether each row satisfies a CHECK constraint: Delta rejects a row whose result is false or null."""
    result = expr.evaluate(columns, rows)
    if isinstance(result, pa.Scalar):
        result = pa.repeat(result if result.is_valid else pa.scalar(None, pa.bool_()), rows)
    return pc.fill_null(result, False)


def value_of(expr: Expr, columns: Mapping[str, pa.Array], rows: int, arrow: pa.DataType) -> pa.Array:
    """The generated column's value for each row, as ``arrow``."""
    result = expr.evaluate(columns, rows)
    if isinstance(result, pa.Scalar):
        result = pa.repeat(result, rows)
    return result if result.type == arrow else pc.cast(result, arrow)
