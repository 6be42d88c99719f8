"""The benchmarks' injected faults do what their scenarios count on (a fault that silently misbehaves makes a
benchmark report nonsense: scenario 5 reported no wasted work once the Delta handle listed its files)."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest

from regional.targets import load_target

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's benchmarks/, not installed
from benchmarks.faults import FailsAfterWork


def test_a_slice_lost_after_its_work_counts_its_rows_as_wasted(tmp_path):
    target = FailsAfterWork({"target": "delta", "path": str(tmp_path / "t"), "queryid": "q" * 32,
                             "failshare": "1.0", "faultdir": str(tmp_path)})
    batches = [pa.record_batch({"value": pa.array(["x"] * n)}) for n in (3, 4)]
    with pytest.raises(TimeoutError, match="benchmark fault"):
        target.prepare(0, "r00", iter(batches))
    assert (tmp_path / "wasted-rows").read_text().split() == ["7"]
    assert not [p for p in (tmp_path / "t").glob("*.parquet")]  # aborted: nothing left behind
    assert load_target({"target": "delta", "path": str(tmp_path / "t"), "queryid": "q" * 32})
