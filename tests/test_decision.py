"""The regional/global decision of one epoch (docs/design.md, "One epoch", step 3): pure, no Spark."""

from dataclasses import replace

from regional.protocol.decide import Outcome, RegionOutcome, decide
from regional.protocol.plan import plan_epoch
from regional.protocol.settings import Settings
from regional.store.model import EpochKind, EpochRecord, RegionState, Slice, Standing
from support import QUERY

SETTINGS = Settings(max_consecutive_failures=3, max_failure_ratio=0.5)


def setup(epoch, previous, available, settings=SETTINGS):
    plan = plan_epoch(epoch, QUERY, "/ck", previous, available, settings)
    record = EpochRecord(epoch - 1, EpochKind.GLOBAL, {}, {}, dict(previous)) if previous else None
    return plan, record


def written(plan, region, rows=None):
    rr = next(r for r in plan.regions if r.region == region)
    return RegionOutcome(region, Outcome.WRITTEN, rr.end, rows if rows is not None else rr.end - rr.start)


def failed(region, status=Outcome.FAILED):
    return RegionOutcome(region, status, 0, reason="boom")


def test_all_written_is_global():
    plan, prev = setup(0, {}, dict.fromkeys("abcd", 10))
    d = decide(plan, {r: written(plan, r) for r in "abcd"}, prev)
    assert d.kind is EpochKind.GLOBAL
    assert d.committed == {r: Slice(0, 10, 10) for r in "abcd"}
    assert all(s == RegionState(10, 0) for s in d.regions.values())


def test_a_failed_region_falls_back_and_the_others_commit():
    plan, prev = setup(5, {r: RegionState(10, 4) for r in "abcd"}, dict.fromkeys("abcd", 20))
    d = decide(plan, {r: written(plan, r) for r in "abc"} | {"d": failed("d")}, prev)
    assert d.kind is EpochKind.REGIONAL and set(d.committed) == {"a", "b", "c"}
    assert d.fallen_back["d"].ref_epoch == 4 and d.fallen_back["d"].reason == "boom"
    assert d.regions["d"] == RegionState(10, 4, 1, Standing.FALLEN_BACK, "boom")
    assert d.regions["a"] == RegionState(20, 5)
    assert d.regional_epochs == 1


def test_regions_without_work_keep_their_state():
    plan, prev = setup(3, {"a": RegionState(10, 2), "b": RegionState(5, 2)}, {"a": 10, "b": 8})
    d = decide(plan, {"b": written(plan, "b")}, prev)
    assert d.kind is EpochKind.GLOBAL and set(d.committed) == {"b"} and not d.fallen_back
    assert d.regions["a"] == RegionState(10, 2)


def test_a_planned_region_without_an_outcome_falls_back():
    plan, prev = setup(0, {}, {"a": 5, "b": 5})
    d = decide(plan, {"a": written(plan, "a")}, prev)
    assert set(d.committed) == {"a"} and d.regions["b"].state is Standing.FALLEN_BACK
    assert d.regions["b"].committed_offset == 0 and d.fallen_back["b"].ref_epoch == -1


def test_more_failures_than_the_ratio_abort_the_epoch():
    plan, prev = setup(1, {r: RegionState(0, 0) for r in "abcd"}, dict.fromkeys("abcd", 5))
    d = decide(plan, {"a": written(plan, "a"), "b": failed("b"), "c": failed("c"), "d": failed("d")}, prev)
    assert d.kind is EpochKind.ABORTED and not d.committed
    assert set(d.fallen_back) == set("abcd") and "maxFailureRatio" in d.fallen_back["a"].reason
    assert d.regions["a"].consecutive_failures == 0  # not its fault
    assert d.regions["b"].consecutive_failures == 1


def test_exactly_the_ratio_is_still_regional():
    plan, prev = setup(1, {r: RegionState(0, 0) for r in "abcd"}, dict.fromkeys("abcd", 5))
    d = decide(plan, {"a": written(plan, "a"), "b": written(plan, "b"), "c": failed("c"), "d": failed("d")}, prev)
    assert d.kind is EpochKind.REGIONAL


def test_tier_one_forces_a_global_epoch_that_commits_when_all_succeed():
    stuck = RegionState(0, None, consecutive_failures=3, state=Standing.FALLEN_BACK)
    plan, prev = setup(4, {"a": RegionState(5, 1), "b": stuck}, {"a": 9, "b": 9})
    d = decide(plan, {"a": written(plan, "a"), "b": written(plan, "b")}, prev)
    assert d.kind is EpochKind.FORCED_GLOBAL and set(d.committed) == {"a", "b"}
    assert "maxConsecutiveFailures" in d.reason
    assert d.regions["b"] == RegionState(9, 4)


def test_tier_two_a_failed_forced_global_epoch_publishes_nothing_and_resets_counters():
    stuck = RegionState(0, None, consecutive_failures=3, state=Standing.FALLEN_BACK)
    plan, prev = setup(4, {"a": RegionState(5, 1), "b": stuck}, {"a": 9, "b": 9})
    d = decide(plan, {"a": written(plan, "a"), "b": failed("b")}, prev)
    assert d.kind is EpochKind.ABORTED and not d.committed and "forced global epoch failed" in d.reason
    assert all(s.consecutive_failures == 0 for s in d.regions.values())
    assert d.regions["a"].committed_offset == 5 and d.regions["b"].committed_offset == 0
    assert d.regions["b"].ref_epoch == -1  # never committed: still on its initial offset
    plan2 = plan_epoch(5, QUERY, "/ck", d.regions, {"a": 9, "b": 9}, SETTINGS)
    assert decide(plan2, {"a": written(plan2, "a"), "b": failed("b")}, d).kind is EpochKind.REGIONAL


def test_a_forced_plan_and_disabled_settings():
    plan, prev = setup(0, {}, {"a": 3})
    forced = decide(replace(plan, force_reason="graceful stop"), {"a": written(plan, "a")}, prev)
    assert forced.kind is EpochKind.FORCED_GLOBAL and forced.reason == "graceful stop"
    plan, prev = setup(0, {}, {"a": 3, "b": 3}, Settings(enabled=False))
    d = decide(plan, {"a": written(plan, "a"), "b": failed("b")}, prev)
    assert d.kind is EpochKind.ABORTED and not d.committed


def test_quarantined_and_missing_outcomes_fall_back_with_their_reason():
    plan, prev = setup(0, {}, dict.fromkeys("abcd", 3), Settings(max_failure_ratio=1.0))
    d = decide(plan, {"a": written(plan, "a"), "b": failed("b", Outcome.QUARANTINED),
                      "c": RegionOutcome("c", Outcome.MISSING, 0, reason="no receipt"), "d": written(plan, "d")}, prev)
    assert d.regions["b"].state is Standing.QUARANTINED and d.fallen_back["b"].quarantined
    assert d.regions["c"].state is Standing.FALLEN_BACK and d.fallen_back["c"].reason == "no receipt"
    assert d.oldest_ref_epoch == -1


def test_a_committed_prefix_moves_the_offset_to_what_was_read():
    plan, prev = setup(0, {}, {"a": 100})
    d = decide(plan, {"a": RegionOutcome("a", Outcome.WRITTEN, 40, 40)}, prev)
    assert d.committed == {"a": Slice(0, 40, 40, cut=True)} and d.regions["a"].committed_offset == 40


def test_a_region_cut_by_region_timeout_leaves_the_epoch_unwhole():
    """Bounded means whole: a region that committed a prefix (cut by regionTimeout) still has the rest of its range
    to read, so an epoch that cut it is not the final global epoch a bounded query or a graceful stop ends on."""
    cut = EpochRecord(3, EpochKind.GLOBAL, {"a": Slice(0, 40, 40, cut=True)}, {}, {"a": RegionState(40, 3)})
    assert not cut.whole
    done = EpochRecord(4, EpochKind.GLOBAL, {"a": Slice(40, 80, 40)}, {}, {"a": RegionState(80, 4)})
    assert done.whole
