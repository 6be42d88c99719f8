"""Planning: ranges from committed offsets, only regions with work, read limits."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from regional.errors import RegionalStoreError
from regional.protocol.plan import EpochPlan, plan_epoch, share_read_limit
from regional.protocol.settings import Settings
from regional.store.model import RegionState, Standing
from support import QUERY


def plan(states, available, **kw):
    return plan_epoch(kw.pop("epoch", 3), QUERY, "/ck", states, available, Settings(), **kw)


def test_ranges_start_at_the_committed_offset_and_only_regions_with_work_are_planned():
    states = {"a": RegionState(5, 2), "b": RegionState(3, 1, 1, Standing.FALLEN_BACK, "down"),
              "idle": RegionState(7, 0)}
    p = plan(states, {"a": 9, "b": 8, "idle": 7, "new": 2})
    assert [(r.region, r.start, r.end, r.ref_epoch) for r in p.regions] == [
        ("a", 5, 9, None), ("b", 3, 8, 1), ("new", 0, 2, None)]


def test_a_thousand_known_regions_with_ten_active_plan_ten_partitions():
    states = {f"r{i:04d}": RegionState(10, 0) for i in range(1000)}
    available = {r: 10 for r in states} | {f"r{i:04d}": 12 for i in range(0, 1000, 100)}
    assert len(plan(states, available).regions) == 10


def test_per_region_and_total_read_limits():
    p = plan({}, {"a": 100, "b": 100, "c": 3}, max_per_region=10)
    assert [(r.start, r.end) for r in p.regions] == [(0, 10), (0, 10), (0, 3)]
    p = plan({}, {"a": 100, "b": 100, "c": 3}, max_total=20)
    assert {r.region: r.end - r.start for r in p.regions} == {"a": 8, "b": 9, "c": 3}


def test_a_shrinking_input_is_an_error_not_a_silent_reread():
    with pytest.raises(RegionalStoreError, match="append-only"):
        plan({"a": RegionState(10, 1)}, {"a": 4})


def test_the_plan_round_trips_through_the_offset_log_and_knows_when_it_is_final():
    p = plan({"a": RegionState(5, 2)}, {"a": 9, "b": 4}, ends={"a": 9, "b": 4}, force_reason="stop")
    assert p.final and EpochPlan.from_offset(p.to_offset()) == p
    assert not plan({}, {"a": 9}, ends={"a": 10}).final
    with pytest.raises(RegionalStoreError, match="not written by this version"):
        EpochPlan.from_offset({"epoch": 1, "regions": {"a": {"start": 0}}})


@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=3), st.integers(0, 1000), max_size=12),
       st.integers(0, 3000), st.integers(0, 50))
def test_a_total_limit_is_shared_without_exceeding_any_backlog_or_the_total(backlogs, total, rotate):
    shares = share_read_limit(backlogs, total, rotate)
    assert set(shares) == set(backlogs)
    assert all(0 <= shares[r] <= backlogs[r] for r in backlogs)
    assert sum(shares.values()) == min(total, sum(backlogs.values()))
    fair = total // len(backlogs) if backlogs else 0
    assert all(shares[r] >= min(backlogs[r], fair) for r in backlogs)  # max-min fair: nobody starves


def test_a_total_limit_below_the_regions_with_work_starves_none_of_them():
    """maxOffsetsPerTrigger=3 over 5 partitions, three of them fed as fast as they are read: before, the even share
    (3 // 5 = 0) gave the 3 records to the largest backlogs every epoch, and the two small ones waited for ever."""
    backlogs = {"a": 1, "b": 1, "c": 100, "d": 100, "e": 100}
    read: dict[str, int] = dict.fromkeys(backlogs, 0)
    for epoch in range(2):  # ceil(5 / 3) epochs
        shares = share_read_limit({r: n - read[r] if n < 100 else n for r, n in backlogs.items()}, 3, rotate=epoch)
        assert sum(shares.values()) == 3 and set(shares.values()) <= {0, 1}, shares
        for r, n in shares.items():
            read[r] += n
    assert read["a"] == read["b"] == 1, read
    assert share_read_limit({"a": 0, "b": 5, "c": 5}, 1, rotate=0) == {"a": 0, "b": 1, "c": 0}  # none to an empty


def test_probes_never_read_below_where_the_query_started():
    """Kafka with startingOffsets=latest: a query that began at offset 1000 never published the records below it, so
    they are no witnesses. Before, probes before a suspect at 1002 (its failures alone having found no witness) read
    down to the log's start and could take those records' failures for published records failing now."""
    settings = Settings(dead_letter_path="/dead", suspects_together=1)
    state = RegionState(1002, 5, 1, Standing.QUARANTINED, "x", isolating=(1002, 1003), failed_alone_at=1.0,
                        alone_since=4, alone_waits=9)
    plan = plan_epoch(6, QUERY, "ck", {"p": state}, {"p": 1010}, settings, first_offsets={"p": 1000})
    assert plan.probes and min(p.start for p in plan.probes) >= 1000, plan.probes
    before = [p for p in plan.probes if p.end <= 1002]
    assert before and before[0].start == 1000  # the records it did publish still testify


def test_a_restart_with_a_lower_suspects_together_plans_no_more_members_than_it_allows():
    """A set of 16 formed under suspectsTogether=16; restarted with 1, its suspect is tried alone (its set shrinks to
    it at the next failure alone); with 4, at most 3 records beside it and the one after them."""
    state = RegionState(100, 5, 1, Standing.QUARANTINED, "x", isolating=(100, 101), failed_alone_at=1.0,
                        alone_since=4, together_to=116)

    def members(together: int) -> list[int]:
        plan = plan_epoch(6, QUERY, "ck", {"p": state}, {"p": 200},
                          Settings(dead_letter_path="/dead", suspects_together=together))
        return [p.start for p in plan.probes if p.isolated]

    assert members(16) == list(range(101, 117))  # the set, and the record after it (its witness)
    assert members(4) == [101, 102, 103, 104] and members(1) == []  # 3 beside it, and one witness
