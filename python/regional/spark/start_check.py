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
_registered_conf: dict[int, dict[str, str]] = {}  # id(session) -> its spark.regional.* conf when registered


def install(session: Any = None, conf: Mapping[str, str] | None = None) -> None:
    """Wrap the writers' methods, once per class. ``session`` and ``conf``: a session ``register`` registered, with
    the ``spark.regional.*`` conf its data source was registered with (the writer's defaults: checked against
    those, not the session's conf at start, which may have changed since)."""
    if session is not None and conf is not None:
        _registered_conf[id(session)] = dict(conf)
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
        for sink in ("foreach", "foreachBatch"):  # Spark's sink from then on, whatever format() said before
            cls_sink = getattr(cls, sink, None)
            if cls_sink is not None:
                setattr(cls, sink, _recording(cls_sink, functools.partial(_sink_is, sink)))
        cls.option = _recording(cls.option, lambda given, key, value: _set(given["options"], key, value))  # type: ignore[attr-defined]
        cls.options = _recording(cls.options, _set_all)  # type: ignore[attr-defined]
    cls.start = _checking(cls.start, classic)  # type: ignore[attr-defined]


def _sink_is(sink: str, given: dict[str, Any], *args: Any, **kwargs: Any) -> None:
    given["format"] = sink


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
            foreach = any(proto.HasField(f) for f in ("foreach_batch", "foreach_writer") if _has_field(proto, f))
            source, seen = (None if foreach else proto.format or None), dict(proto.options)
        source = format or source
        if source is not None and str(source).lower() == "regional":
            for key, value in options.items():
                _set(seen, key, value)
            if path is not None:
                seen["path"] = path
            session = self._spark if classic else self._session
            columns = self._df.schema.fieldNames() if classic else None
            conf = _registered_conf.get(id(session))
            check_at_start(seen, columns, session.conf.getAll if conf is None else conf)
        return start(self, path, format, outputMode, partitionBy, queryName, **options)
    return wrapper


def _has_field(proto: Any, name: str) -> bool:
    try:
        proto.HasField(name)
    except ValueError:  # another Spark Connect protocol: no such field
        return False
    return True


def check_at_start(options: Mapping[str, Any], columns: list[str] | None, conf: Mapping[str, str]) -> None:
    """The writer's own checks of its options (and of the columns, where the client knows them)."""
    from pyspark.sql.datasource import CaseInsensitiveDict
    from pyspark.sql.readwriter import to_str

    from regional.spark.writer import check_write_options

    # as pyspark hands them to Spark: True is "true", None is left out
    given = {k: to_str(v) for k, v in options.items() if v is not None}
    check_write_options(CaseInsensitiveDict(given),
                        columns, {k: v for k, v in conf.items() if k.lower().startswith("spark.regional.")})
