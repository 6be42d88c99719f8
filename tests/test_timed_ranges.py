"""regionTimeout sizes a straggler's next ranges to what it did within the timeout (pure, no Spark)."""

from hypothesis import example, given
from hypothesis import strategies as st

from regional.protocol.decide import MIN_TIMED_RANGE, Outcome, RegionOutcome, decide, timed_range
from regional.protocol.plan import plan_epoch
from regional.protocol.settings import Settings
from regional.store.model import EpochKind, EpochRecord, RegionState
from support import QUERY

TIMED = Settings(region_timeout_s=1.0)


def epoch_of(epoch, states, available, seconds, settings=TIMED):
    """Plan ``epoch``, write every planned range whole in ``seconds[region]``, decide."""
    plan = plan_epoch(epoch, QUERY, "/ck", states, available, settings)
    previous = EpochRecord(epoch - 1, EpochKind.GLOBAL, {}, {}, dict(states)) if states else None
    outcomes = {rr.region: RegionOutcome(rr.region, Outcome.WRITTEN, rr.end, rr.end - rr.start,
                                         seconds=seconds[rr.region]) for rr in plan.regions}
    return plan, decide(plan, outcomes, previous)


def test_a_straggler_gets_what_it_did_per_timeout_and_the_others_keep_their_ranges():
    _plan, record = epoch_of(0, {}, dict.fromkeys("abcd", 1000), {"a": 0.3, "b": 0.3, "c": 0.35, "d": 8.0})
    assert record.regions["d"].timed_range == 125  # 1,000 offsets in 8 s: 125 per second of regionTimeout
    assert all(record.regions[r].timed_range is None for r in "abc")
    plan, _ = epoch_of(1, record.regions, dict.fromkeys("abcd", 3000), {r: 0.3 for r in "abcd"})
    assert {rr.region: rr.end - rr.start for rr in plan.regions} == {"a": 2000, "b": 2000, "c": 2000, "d": 125}


def test_slowness_every_region_shares_sizes_no_one_down():
    _plan, record = epoch_of(0, {}, dict.fromkeys("abc", 1000), {"a": 3.0, "b": 3.2, "c": 2.9})
    assert all(s.timed_range is None for s in record.regions.values())


def test_a_limit_grows_when_used_in_time_and_goes_when_not_needed():
    assert timed_range(1.0, 200, 200, 0.4, False) == 400  # used whole, in time: at most twice
    assert timed_range(1.0, 200, 200, 0.8, False) == 250  # used whole, in time: by what time allows
    assert timed_range(1.0, 200, 50, 0.2, False) is None  # less than its limit, in time: no limit
    assert timed_range(1.0, 200, 200, 4.0, False) == MIN_TIMED_RANGE  # still slow: shrinks, not below the floor
    assert timed_range(1.0, 200, 200, None, False) == 200  # unmeasured: unchanged
    assert timed_range(1.0, None, 1000, 3.0, False) is None  # over time but no straggler: the source's cut applies


def test_without_regiontimeout_nothing_is_sized_and_old_limits_go():
    states = {"a": RegionState(0, None, timed_range=100)}
    plan, record = epoch_of(0, states, {"a": 1000}, {"a": 9.0}, Settings())
    assert plan.regions[0].end == 1000 and record.regions["a"].timed_range is None


@given(st.none() | st.integers(1, 10**6), st.integers(1, 10**6), st.none() | st.floats(0, 100), st.booleans())
@example(cap=1, span=1, seconds=0.5, straggler=False)
def test_a_limit_is_none_or_at_least_the_floor_and_an_overrun_never_grows_it(cap, span, seconds, straggler):
    out = timed_range(1.0, cap, span, seconds, straggler)
    if seconds is None:
        assert out == cap
        return
    assert out is None or out >= MIN_TIMED_RANGE
    if seconds > 1.0 and out is not None:
        assert out <= max(span, MIN_TIMED_RANGE)
