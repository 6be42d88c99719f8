"""Every option regional takes, declared once, where it is read: a source, a target or the sink itself.

Each source and target module declares ``OPTIONS``: an ``OptionTable`` listing the options it reads, and the
options of the stock piece it replaces (Spark's text source, Spark's Kafka source, delta-spark's writer, JDBC)
with regional's answer to each: honoured with the stock meaning, or refused (``refused`` says why and what to
do). The reader and the writer check a query's options against these tables at start (``check_given``): an
option nobody declares is refused by name (a typo must not pass for a setting), and a refused one is refused
with its advice. The documentation's options tables are rendered from the same declarations (``markdown``), so
the docs cannot drift from the code.

Pure: no Spark, no I/O.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from regional.errors import RegionalConfigError


@dataclass(frozen=True)
class Option:
    """One option. ``name`` is its documented spelling (Spark matches option keys without case)."""

    name: str
    default: str  # as the docs show it: "" for none, "required", or the value
    meaning: str  # one or two sentences for the docs' table
    refused: str | None = None  # given at all: refused at start, with this reason and what to do instead
    prefix: bool = False  # ``name`` is a prefix: every key starting with it is this option (``kafka.``)
    stock: bool = False  # an option of the stock piece regional replaces (shown as such in the docs)

    def matches(self, key: str) -> bool:
        lowered = key.lower()
        return lowered.startswith(self.name.lower()) if self.prefix else lowered == self.name.lower()


@dataclass(frozen=True)
class OptionTable:
    """The options of one source, target or part of the query (``title``: what the docs call it)."""

    title: str
    options: tuple[Option, ...]

    def __init__(self, title: str, options: Iterable[Option]) -> None:
        object.__setattr__(self, "title", title)
        object.__setattr__(self, "options", tuple(options))

    def find(self, key: str) -> Option | None:
        exact = next((o for o in self.options if not o.prefix and o.matches(key)), None)
        return exact or next((o for o in self.options if o.prefix and o.matches(key)), None)

    def names(self) -> list[str]:
        return [o.name for o in self.options]


# Options Spark itself puts into a Python data source's options, or that every stream takes.
SPARK_READ = OptionTable("Spark's own (readStream)", [
    Option("path", "", "`.load(path)`: the source's location, where the source takes one."),
])
SPARK_WRITE = OptionTable("Spark's own (writeStream)", [
    Option("path", "", "`.start(path)`: the target's location, where the target takes one."),
    Option("checkpointLocation", "required", "The query's checkpoint; regional's store lives under it."),
    Option("queryName", "", "`.queryName(...)`: the query's name, as Spark uses it."),
])


def check_given(side: str, given: Mapping[str, str], tables: Sequence[OptionTable]) -> None:
    """Refuse, at start, an option that no table declares (naming it, with the nearest declared name) or one that a
    table declares refused. ``side``: how the user gave them (``readStream`` or ``writeStream``)."""
    for key in sorted(given):
        found = next((o for t in tables if (o := t.find(key)) is not None), None)
        if found is None:
            names = sorted({n for t in tables for n in t.names()})
            near = difflib.get_close_matches(key.lower(), [n.lower() for n in names], n=1, cutoff=0.75)
            hint = ""
            if near:
                hint = f" Did you mean {next(n for n in names if n.lower() == near[0])!r}?"
            raise RegionalConfigError(
                f"{side} option {key!r} is not an option of {' or '.join(t.title for t in tables[:1])} nor of the "
                f"regional query.{hint} Remove it, or correct its name: the options are listed in the docs "
                f"(docs/options.md), by source and target")
        if found.refused is not None:
            raise RegionalConfigError(f"{side} option {found.name!r} is not supported by regional: {found.refused}")


def markdown(table: OptionTable) -> str:
    """The table as the docs show it: name, default, meaning (refused options say so)."""
    rows = ["| option | default | meaning |", "| --- | --- | --- |"]
    for o in table.options:
        name = f"`{o.name}*`" if o.prefix else f"`{o.name}`"
        default = f"`{o.default}`" if o.default and o.default != "required" else (o.default or "")
        meaning = o.meaning if o.refused is None else f"**Refused at start**: {o.refused}"
        if o.stock:
            meaning = f"{meaning} *(stock option)*"
        rows.append(f"| {name} | {default} | {meaning.replace('|', '&#124;')} |")
    return "\n".join(rows)


def declared_by(component: object) -> OptionTable | None:
    """The options a source's or target's instance declares.

    regional's own classes: the class's ``OPTIONS``, else its module's or the nearest enclosing package's, else
    those of a class it derives from (a source or target that is a package declares them once). A user's
    ``python:`` class declares its own ``OPTIONS`` (in the class body) or nothing: with none, its options are not
    checked (so a subclass of a built-in target may read options of its own); with some, they are checked against
    its table and the built-in base's, so it lists only its own."""
    inner = getattr(component, "inner", component)  # a user's class wrapped as a Target
    outer = type(inner)
    base = next((t for c in outer.__mro__ if _is_regional(c) and (t := _table_of(c)) is not None), None)
    if _is_regional(outer):
        return base
    own = next((t for c in outer.__mro__
                if not _is_regional(c) and isinstance(t := c.__dict__.get("OPTIONS"), OptionTable)), None)
    if own is None:
        return None
    return own if base is None else OptionTable(own.title, own.options + base.options)


def _is_regional(cls: type) -> bool:
    return cls.__module__ == "regional" or cls.__module__.startswith("regional.")


def _table_of(cls: type) -> OptionTable | None:
    """A regional class's table: its own ``OPTIONS``, else its module's or an enclosing package's."""
    import sys

    table = cls.__dict__.get("OPTIONS")
    module = cls.__module__
    while not isinstance(table, OptionTable) and module:
        table = getattr(sys.modules.get(module), "OPTIONS", None)
        module = module.rpartition(".")[0]
    return table if isinstance(table, OptionTable) else None
