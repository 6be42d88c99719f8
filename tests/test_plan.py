import pytest

from regional.errors import RegionalStoreError
from regional.plan import EpochPlan, RegionCursor, plan_epoch


def test_each_range_starts_at_the_committed_offset_not_the_previous_end():
    cursors = {"a": RegionCursor(10, 4), "b": RegionCursor(3, 1)}  # b fell back at epoch 2, 3, 4
    plan = plan_epoch(5, "/ck", cursors, {"a": 12, "b": 20})
    assert [(r.region, r.start, r.end, r.ref_epoch) for r in plan.regions] == [
        ("a", 10, 12, 4), ("b", 3, 20, 1)]


def test_every_known_region_gets_a_range_in_sorted_order_even_when_empty():
    plan = plan_epoch(2, "/ck", {"z": RegionCursor(5, 1), "m": RegionCursor(0, None)}, {"a": 4, "m": 0})
    assert [r.region for r in plan.regions] == ["a", "m", "z"]
    assert [(r.start, r.end) for r in plan.regions] == [(0, 4), (0, 0), (5, 5)]
    assert plan.has_work


def test_admission_control_caps_each_region():
    plan = plan_epoch(0, "/ck", {"a": RegionCursor(100, 0)}, {"a": 1000, "b": 5}, max_records_per_region=50)
    assert [(r.start, r.end) for r in plan.regions] == [(100, 150), (0, 5)]


def test_nothing_new_means_no_work():
    plan = plan_epoch(3, "/ck", {"a": RegionCursor(7, 2)}, {"a": 7})
    assert not plan.has_work


def test_a_shrinking_input_is_refused():
    with pytest.raises(RegionalStoreError, match="append-only"):
        plan_epoch(1, "/ck", {"a": RegionCursor(10, 0)}, {"a": 4})


def test_plan_round_trips_through_the_offset_json_spark_logs():
    plan = plan_epoch(9, "/ck", {"a": RegionCursor(1, 8), "b/../c": RegionCursor(0, None)}, {"a": 3, "b/../c": 2})
    assert EpochPlan.from_offset(plan.to_offset()) == plan
    assert list(plan.to_offset()["regions"]) == ["a", "b/../c"]


def test_a_foreign_offset_is_a_clear_error():
    with pytest.raises(RegionalStoreError, match="not written by the regional source"):
        EpochPlan.from_offset({"logOffset": 3})


def test_a_plan_is_final_only_when_it_reaches_the_bounded_inputs_end():
    cursors = {"a": RegionCursor(0, None), "b": RegionCursor(0, None)}
    growing = plan_epoch(0, "/ck", cursors, {"a": 10, "b": 10}, ends={"a": 30, "b": 30})
    assert not growing.final  # what is available now is not the end yet
    capped = plan_epoch(2, "/ck", cursors, {"a": 30, "b": 30}, max_records_per_region=20, ends={"a": 30, "b": 30})
    assert not capped.final
    last = plan_epoch(3, "/ck", {"a": RegionCursor(20, 2), "b": RegionCursor(20, 2)}, {"a": 30, "b": 30},
                      ends={"a": 30, "b": 30})
    assert last.final and not plan_epoch(3, "/ck", cursors, {"a": 30, "b": 30}).final  # unbounded: never


def test_a_forced_global_request_travels_in_the_plan():
    plan = plan_epoch(4, "/ck", {}, {"a": 3}, force_reason="a graceful stop asked for a final global epoch")
    assert EpochPlan.from_offset(plan.to_offset()).force_reason == plan.force_reason
