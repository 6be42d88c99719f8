"""writeStream's options checked at ``start()``, before Spark starts the query (issue 58).

Spark builds a Python data source's stream writer in the query's own thread, after the source planned the first
epoch: a misspelled writeStream option would fail there, seconds later, with a checkpoint already written.
``register`` wraps ``DataStreamWriter.start`` (classic pyspark's and Spark Connect's) so that a query whose format
is ``regional`` has its writeStream options checked first, by the same checks the writer makes
(``regional.spark.writer.check_write_options``): what passes here passes there.

Classic pyspark keeps the format and options in the JVM, so ``format``, ``option`` and ``options`` are wrapped too,
to see them in Python; Spark Connect's writer holds them in its request (``_write_proto``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

_GIVEN = "_regional_given"  # the classic writer's attribute: {"format": ..., "options": {...}}
_installed: set[type] = set()


def install() -> None:
    """Wrap the writers' methods, once per class."""
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    _wrap(DataStreamWriter, classic=True)
    try:
        from pyspark.sql.connect.streaming.readwriter import DataStreamWriter as ConnectWriter
    except ImportError:  # pyspark without Spark Connect's client dependencies (grpc)
        return
    _wrap(ConnectWriter, classic=False)


def _wrap(cls: type, classic: bool) -> None:
    if cls in _installed:
        return
    _installed.add(cls)
    if classic:
        cls.format = _recording(cls.format, lambda given, source: given.__setitem__("format", source))  # type: ignore[attr-defined]
        cls.option = _recording(cls.option, lambda given, key, value: _set(given["options"], key, value))  # type: ignore[attr-defined]
        cls.options = _recording(cls.options, _set_all)  # type: ignore[attr-defined]
    cls.start = _checking(cls.start, classic)  # type: ignore[attr-defined]


def _set_all(given: dict[str, Any], **options: Any) -> None:
    for key, value in options.items():
        _set(given["options"], key, value)


def _set(options: dict[str, Any], key: str, value: Any) -> None:
    """As Spark keeps writeStream's options: case-insensitive, the last value given wins."""
    for other in [k for k in options if k.lower() == key.lower()]:
        del options[other]
    options[key] = value


def _given(writer: object) -> dict[str, Any]:
    given = writer.__dict__.get(_GIVEN)
    if given is None:
        given = writer.__dict__[_GIVEN] = {"format": None, "options": {}}
    return given


def _recording(method: Callable[..., Any], note: Callable[..., None]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: object, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)  # pyspark's checks first: a bad value fails as it always did
        note(_given(self), *args, **kwargs)
        return result
    return wrapper


def _checking(start: Callable[..., Any], classic: bool) -> Callable[..., Any]:
    @functools.wraps(start)
    def wrapper(self: Any, path: str | None = None, format: str | None = None, outputMode: str | None = None,
                partitionBy: Any = None, queryName: str | None = None, **options: Any) -> Any:
        if classic:
            given = _given(self)
            source, seen = given["format"], dict(given["options"])
        else:
            proto = self._write_proto
            source, seen = proto.format or None, dict(proto.options)
        source = format or source
        if source is not None and str(source).lower() == "regional":
            for key, value in options.items():
                _set(seen, key, value)
            if path is not None:
                seen["path"] = path
            session = self._spark if classic else self._session
            columns = self._df.schema.fieldNames() if classic else None
            check_at_start(seen, columns, session.conf.getAll)
        return start(self, path, format, outputMode, partitionBy, queryName, **options)
    return wrapper


def check_at_start(options: Mapping[str, Any], columns: list[str] | None, conf: Mapping[str, str]) -> None:
    """The writer's own checks of its options (and of the columns, where the client knows them)."""
    from pyspark.sql.datasource import CaseInsensitiveDict
    from pyspark.sql.readwriter import to_str

    from regional.spark.writer import check_write_options

    # as pyspark hands them to Spark: True is "true", None is left out
    given = {k: to_str(v) for k, v in options.items() if v is not None}
    check_write_options(CaseInsensitiveDict(given),
                        columns, {k: v for k, v in conf.items() if k.lower().startswith("spark.regional.")})
