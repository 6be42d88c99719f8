"""The sink's own contract (issue: explode dead-lettered healthy records): 0..n rows per offset are normal input;
rows out of offset order are the query's error, reported to the driver, never an upstream failure."""

from __future__ import annotations

import pyarrow as pa
import pytest

from regional.coordinator import commit_epoch
from regional.errors import RegionalPlanError
from regional.protocol.decide import Outcome, TaskOutcome, outcomes_from_tasks
from regional.protocol.plan import plan_epoch
from regional.protocol.settings import Settings
from regional.spark.writer import SliceGuard
from regional.store import Store
from support import MemoryTarget


def batch(region: str, offsets: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"region": [region] * len(offsets), "offset": pa.array(offsets, pa.int64()),
                            "value": [f"v{o}" for o in offsets]})


def test_several_rows_of_one_offset_and_none_of_another_pass_the_guard():
    guard = SliceGuard(0, keep_region_columns=True)
    rows = list(guard.batches(iter([batch("a", [0, 1, 1, 1]), batch("a", [1, 3]), batch("a", [3, 7])])))
    assert sum(b.num_rows for b in rows) == 8 and guard.violation is None and guard.error is None
    assert (guard.first_offset, guard.last_offset, guard.rows) == (0, 7, 8)


@pytest.mark.parametrize("batches", [[batch("a", [0, 2, 1])], [batch("a", [4, 5]), batch("a", [3])],
                                     [batch("a", [0]), batch("b", [1])]])
def test_rows_out_of_order_or_of_two_regions_are_a_violation_not_an_upstream_failure(batches):
    guard = SliceGuard(0, keep_region_columns=True)
    passed = list(guard.batches(iter(batches)))  # no exception: nothing for Spark to retry or quarantine
    assert guard.error is None and guard.violation is not None and len(passed) < len(batches)
    assert "out of offset order" in guard.violation or "mixes regions" in guard.violation


def test_a_violation_fails_the_epoch_at_the_driver_and_publishes_nothing(tmp_path):
    store = Store(tmp_path / "ck")
    query_id = store.open_query()
    plan = plan_epoch(0, query_id, str(store.checkpoint), {}, {"a": 3, "b": 3}, Settings())
    tasks = [TaskOutcome(0, 0, Outcome.FAILED, region="a", rows=1, handle="h-a", reason="out of offset order",
                         plan_error="sink task 0: region 'a' arrived out of offset order"),
             TaskOutcome(1, 0, Outcome.WRITTEN, query_id, "b", 0, 3, 3, 0, 2, "h-b")]
    with pytest.raises(RegionalPlanError, match="out of offset order"):
        outcomes_from_tasks(plan, tasks)
    target = MemoryTarget()
    with pytest.raises(RegionalPlanError, match="epoch 0: sink task 0"):
        commit_epoch(plan, tasks, store, target)
    assert target.commits == {} and target.aborted == [(0, {"a": "h-a", "b": "h-b"})]
    assert store.read_intent(0) is None and store.epochs() == []
