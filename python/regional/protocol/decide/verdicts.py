"""The user's and the target's verdict on an isolated record's failures, from their exception classes
(``deadLetterOn``, ``outageOn``, ``RowsInvalid``; docs/dead-letters.md, "Your own verdict"). Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from regional.protocol.settings import ALWAYS_OUTAGE, ALWAYS_POISON, Settings
from regional.store.model import (
    TaskFailure,
)


class Verdict(NamedTuple):
    """What the exception classes of an isolated record's failed attempts say, before any evidence."""

    poison: bool  # True: the record's fault, dead-lettered at once; False: an outage, never dead-lettered
    why: str  # the class and what named it, for the reason
    # The target's verdict (``RowsInvalid``): trusted only while records beside it pass the same target in the same
    # epoch, since a fault of the query or the table (a column left out, a rule changed) refuses every row alike.
    by_target: bool = False


# Python's exception line (``exception_line``):
# ``ValueError: bad``, ``json.decoder.JSONDecodeError: Expecting value: ...``, ``mymodule.MyError`` (an empty
# message), ``pkg.f.<locals>.MyError: ...`` (a class defined in a function). Anything else is no exception line.
_PART = r"(?:[^\W\d][\w$]*|<locals>)"
_EXCEPTION_LINE = re.compile(rf"({_PART}(?:\.{_PART})*)(?::(?:\s.*)?)?", re.DOTALL)


def failure_class(failure: TaskFailure) -> str | None:
    """The exception class one failed attempt raised, fully qualified as far as known. A Python worker's failure (a
    UDF, the regional source or sink) is the JVM's ``PythonException`` around Python's traceback: its class is that of
    the traceback's exception line (``ValueError``, ``json.decoder.JSONDecodeError``), read from the failure's whole
    description only where it leaves no doubt (``exception_line``). Any other failure's class is the JVM's. None
    when nothing can be named: no description, or an ambiguous one (then the evidence rule decides)."""
    if not failure.in_python:
        return failure.exception_class.strip() or None
    line = exception_line(failure.description)
    found = None if line is None else _EXCEPTION_LINE.fullmatch(line.strip())
    if found is None or found.group(1).endswith("<locals>"):
        return None
    return found.group(1)


_TRACEBACK = "Traceback (most recent call last):"
_SPARK_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+")
# What Python prints between the tracebacks of chained exceptions: only after these is a second traceback Python's.
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")


def exception_line(description: str | None) -> str | None:
    """The exception line of a Python traceback, or None where it is in doubt. A message may hold anything, a line
    that looks like another class's (``RuntimeError("upstream said:\nValueError: x")``), a traceback of its own,
    notes (``add_note``): so every traceback header but the first must follow a chained-exception separator, and
    after the last traceback's frames (indented) exactly one line may follow, the exception's."""
    if not description:
        return None
    lines = [line.rstrip() for line in description.splitlines() if line.strip()]
    if lines and _SPARK_SQLSTATE.fullmatch(lines[-1]):
        lines.pop()  # Spark's error-class suffix after the traceback (`` SQLSTATE: 38000``)
    # Spark's first line: ``[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (...):``
    headers = [i for i, line in enumerate(lines) if line.endswith(_TRACEBACK)]
    if not headers or any(lines[i].startswith((" ", "\t")) for i in headers):
        return None  # none, or an exception group's (indented): no single class
    if any(lines[h].strip() != _TRACEBACK or lines[h - 1].strip() not in _CHAINED for h in headers[1:]):
        return None  # a traceback inside a message
    rest = lines[headers[-1] + 1:]
    frames = 0
    while frames < len(rest) and rest[frames].startswith((" ", "\t")):
        frames += 1
    block = rest[frames:]
    return block[0] if frames and len(block) == 1 else None


def names_failure(name: str, cls: str, failure: TaskFailure) -> bool:
    """Whether the configured ``name`` names the class a failure raised: a Python worker's exception by
    ``class_matches``, a JVM failure only by its fully qualified Java name (a bare ``AssertionError`` meant for
    Python's ``assert`` must not name ``java.lang.AssertionError``, nor ``SparkException`` a crashed worker)."""
    if failure.in_python:
        return class_matches(name, cls)
    return name == cls


def class_matches(name: str, cls: str) -> bool:
    """Whether the configured ``name`` names the class ``cls``: the same simple name (the last part), and the name's
    module path, if any, a prefix of the class's. ``JSONDecodeError`` and ``json.JSONDecodeError`` name
    ``json.decoder.JSONDecodeError``; ``decoder.JSONDecodeError`` does not. Only names: a subclass is matched by its
    own name, never by its base class's (the driver sees the name of the class, not its bases)."""
    *module, simple = name.split(".")
    *cls_module, cls_simple = cls.split(".")
    return simple == cls_simple and cls_module[:len(module)] == module


def verdict_of(settings: Settings, failures: Sequence[TaskFailure]) -> Verdict | None:
    """The verdict of an isolated record's failed attempts (the JVM shim's failure records): an outage when any
    attempt raised a class named as one (``outageOn``, ``regional.Outage``); the record's fault when every attempt
    before the quarantine (``regionAttempts`` of them) is recorded and raised a class named as such
    (``deadLetterOn``, ``regional.PoisonRecord``, a target's ``RowsInvalid``); else None: the evidence rule decides
    (never a verdict on absent information)."""
    if not settings.isolates:
        return None
    classes = [(f, failure_class(f)) for f in failures]
    for f, cls in classes:
        if cls is None:
            continue
        for name in settings.outage_on:
            if names_failure(name, cls, f):
                return Verdict(False, f"{cls}, named by outageOn ({name})")
        if any(names_failure(name, cls, f) for name in ALWAYS_OUTAGE):
            return Verdict(False, f"{cls}, raised to say so")
    if not {f.attempt for f in failures} >= set(range(settings.region_attempts)):
        return None  # an attempt without a record: what it raised is not known
    whys, by_target = [], False
    for f, cls in classes:
        if cls is None:
            return None
        if any(names_failure(name, cls, f) for name in ALWAYS_POISON):
            target = cls.endswith("RowsInvalid")
            by_target = by_target or target
            why = f"{cls}, the target's verdict about the row" if target else f"{cls}, raised to say so"
        else:
            named = next((n for n in settings.dead_letter_on if names_failure(n, cls, f)), None)
            if named is None:
                return None
            why = f"{cls}, named by deadLetterOn ({named})"
        if why not in whys:
            whys.append(why)
    return Verdict(True, "; ".join(whys), by_target)


# -- The decision ---------------------------------------------------------------------------

