"""The Delta target's file statistics never state a wrong bound (a wrong bound makes delta-spark skip a file that
holds matching rows): properties over random values. Equality with delta-spark's own stats is checked against
delta-spark in integration/test_delta_stats_like_spark.py."""

from __future__ import annotations

import json
import math

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from regional.targets.delta.stats import FileStats, _column_paths, spec, truncate_max

TEXT = st.text(st.sampled_from(["a", "b", "\x7e", "\x7f", "\x80", "é", "\uffff", "\ufffd", "😀", "\U0010ffff",
                                "\U0010fffe", "\x00"]), max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), TEXT), min_size=1, max_size=6), st.integers(0, 5))
def test_string_bounds_hold_every_value_in_utf8_order(values, prefix):
    schema = pa.schema([("s", pa.string())])
    stats = FileStats({"prefix": prefix, "tight": False, "columns": [["s", "s", None]]}, schema)
    stats.add(pa.record_batch([pa.array(values, pa.string())], schema=schema))
    data = json.loads(stats.to_json())
    present = [v.encode() for v in values if v is not None]
    assert data["nullCount"]["s"] == len(values) - len(present)
    low, high = data["minValues"].get("s"), data["maxValues"].get("s")
    if present:
        assert low is not None and all(low.encode() <= v for v in present)
        assert high is None or all(high.encode() >= v for v in present)
    else:
        assert low is None and high is None


@given(TEXT, st.integers(1, 6))
def test_truncated_max_is_an_upper_bound(value, prefix):
    got = truncate_max(value, prefix)
    assert got is None or got.encode() >= value.encode()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)), min_size=1, max_size=8))
def test_float_bounds_order_nan_above_all_as_spark(values):
    schema = pa.schema([("f", pa.float64())])
    stats = FileStats(None, schema)
    stats.add(pa.record_batch([pa.array(values, pa.float64())], schema=schema))
    data = json.loads(stats.to_json())
    numbers = [v for v in values if v is not None]
    if not numbers:
        assert "f" not in data["minValues"]
        return

    def value(text):
        return {"NaN": math.inf * 2, "Infinity": math.inf, "-Infinity": -math.inf}.get(text, text) \
            if isinstance(text, str) else text

    low, high = value(data["minValues"]["f"]), value(data["maxValues"]["f"])
    for v in numbers:
        if math.isnan(v):
            assert data["maxValues"]["f"] == "NaN"
        else:
            assert (math.isnan(low) or low <= v) and (math.isnan(high) or high >= v)


def test_indexed_columns_as_delta_spark_chooses_them():
    schema = {"fields": [{"name": "p", "type": "string"}, {"name": "a", "type": "long"},
                         {"name": "s", "type": {"type": "struct", "fields": [
                             {"name": "x", "type": "long"}, {"name": "Y", "type": "string"}]}},
                         {"name": "c", "type": "string"}]}
    first = spec(schema, {"delta.dataSkippingNumIndexedCols": "2"}, ["p"], False, False)
    assert first["columns"] == [["a", "a", None], ["s", "s", [["x", "x", None]]]]
    named = spec(schema, {"delta.dataSkippingStatsColumns": "C, s.`y`"}, ["p"], False, True)
    assert named["columns"] == [["s", "s", [["Y", "Y", None]]], ["c", "c", None]] and named["tight"]
    assert spec(schema, {"delta.dataSkippingNumIndexedCols": "-1"}, ["p"], False, False)["columns"][2] == \
        ["c", "c", None]
    assert _column_paths("a, `b.c`.d") == [["a"], ["b.c", "d"]] and _column_paths("a b") is None
