"""writeStream's options checked at start() (issue 58): the wrappers see what the script gave, in any of
pyspark's ways, and check only regional queries, with the writer's own checks."""

from __future__ import annotations

from typing import Any

import pytest

from regional.errors import RegionalConfigError
from regional.spark import start_check
from regional.spark.writer import check_write_options


class _Schema:
    def __init__(self, names: list[str]) -> None:
        self.names = names

    def fieldNames(self) -> list[str]:
        return self.names


class _Conf:
    getAll: dict[str, str] = {}


class FakeWriter:
    """The shape of classic pyspark's DataStreamWriter that the wrappers use; ``start`` records that it ran."""

    def __init__(self, columns: list[str]) -> None:
        self._df = type("DF", (), {"schema": _Schema(columns)})()
        self._spark = type("Session", (), {"conf": _Conf()})()
        self.started = False

    def format(self, source: str) -> FakeWriter:
        return self

    def option(self, key: str, value: Any) -> FakeWriter:
        return self

    def options(self, **options: Any) -> FakeWriter:
        return self

    def foreachBatch(self, func: Any) -> FakeWriter:
        return self

    def start(self, path: str | None = None, format: str | None = None, outputMode: str | None = None,
              partitionBy: Any = None, queryName: str | None = None, **options: Any) -> str:
        self.started = True
        self.start_arguments = (outputMode, partitionBy, queryName)
        return "query"


start_check._wrap(FakeWriter, classic=True)
COLUMNS = ["region", "offset", "value"]


def test_a_regional_writers_typo_fails_start_before_the_query_starts(tmp_path):
    writer = FakeWriter(COLUMNS).format("regional").option("target", "delta").option("path", str(tmp_path / "t"))
    writer = writer.options(checkpointLocation=str(tmp_path / "ck"), mergeSchemaa=True)
    with pytest.raises(RegionalConfigError, match=r"(?i)'mergeschemaa' is not an option.*did you mean 'mergeSchema'"):
        writer.start()
    assert not writer.started and not (tmp_path / "ck").exists()


def test_start_arguments_count_and_good_options_start(tmp_path):
    writer = FakeWriter(COLUMNS).option("target", "delta").option("checkpointLocation", str(tmp_path / "ck"))
    with pytest.raises(RegionalConfigError, match=r"(?i)'pathh' is not an option"):
        writer.start(str(tmp_path / "t"), format="regional", pathh=str(tmp_path / "t"))
    # start()'s own parameters are Spark's, not options; an option given again in another case replaces it
    writer.option("PATHH", "x").option("pathh", "y").option("Pathh", None)
    assert writer.start(str(tmp_path / "t"), "regional", outputMode="append", queryName="q", partitionBy="region",
                        keepRegionColumns=True) == "query"
    assert writer.start_arguments == ("append", "region", "q")


def test_other_formats_and_python_targets_are_left_to_start(tmp_path):
    assert FakeWriter(["value"]).format("delta").option("pathh", "x").start() == "query"
    # foreachBatch after format("regional"): Spark's foreachBatch sink, not regional's
    assert FakeWriter(["value"]).format("regional").foreachBatch(print).start() == "query"
    writer = FakeWriter(COLUMNS).format("regional").option("target", "python:no_such_module:X")
    assert writer.option("checkpointLocation", str(tmp_path)).option("anything", "1").start() == "query"


def test_the_writers_checks_without_spark():
    with pytest.raises(RegionalConfigError, match="needs the columns 'region' and 'offset'"):
        check_write_options({"target": "delta", "path": "/t", "checkpointlocation": "/ck"}, ["value"], {})
    with pytest.raises(RegionalConfigError, match="checkpointLocation"):
        check_write_options({"target": "delta", "path": "/t"}, None, {})
    with pytest.raises(RegionalConfigError, match="is the target table itself"):
        check_write_options({"target": "delta", "path": "/t", "checkpointlocation": "/ck"}, None,
                            {"spark.regional.deadLetterPath": "/t"})


def test_the_check_reads_the_conf_the_session_was_registered_with(tmp_path, monkeypatch):
    """The writer's defaults are the spark.regional.* conf at register(); a later spark.conf.set does not reach it."""
    monkeypatch.setattr(start_check, "_registered_conf", {})
    table = str(tmp_path / "t")
    writer = FakeWriter(COLUMNS).format("regional").option("target", "delta").option("checkpointLocation", table + "c")
    writer._spark.conf = type("Conf", (), {"getAll": {"spark.regional.deadLetterPath": table}})()
    start_check.install(writer._spark, {})  # registered without it: the writer will not use it
    assert writer.start(table) == "query"
    start_check.install(writer._spark, {"spark.regional.deadLetterPath": table})
    with pytest.raises(RegionalConfigError, match="is the target table itself"):
        writer.start(table)
