from regional.config import RegionalPolicy
from regional.decision import EpochKind, RegionOutcome, RegionRecord, RegionState, Status, decide
from regional.plan import RegionCursor, plan_epoch

POLICY = RegionalPolicy(max_consecutive_failures=3, max_failure_ratio=0.5)


def setup(epoch, previous, available):
    cursors = {r: RegionCursor(s.committed_offset, s.current_epoch) for r, s in previous.items()}
    return plan_epoch(epoch, "/ck", cursors, available)


def written(plan, region, rows=None):
    rr = next(r for r in plan.regions if r.region == region)
    return RegionOutcome(region, Status.WRITTEN, rr.end, rows if rows is not None else rr.end - rr.start)


def failed(region, status=Status.FAILED):
    return RegionOutcome(region, status, 0, reason="boom")


def test_all_written_is_global():
    prev = {r: RegionRecord(0, None) for r in "abcd"}
    plan = setup(0, prev, dict.fromkeys("abcd", 10))
    d = decide(plan, {r: written(plan, r) for r in "abcd"}, prev, POLICY)
    assert d.kind is EpochKind.GLOBAL
    assert d.committed == {r: (0, 10, 10) for r in "abcd"}
    assert all(s.committed_offset == 10 and s.current_epoch == 0 and s.ref_epoch is None for s in d.regions.values())


def test_a_failed_region_falls_back_and_the_others_commit():
    prev = {r: RegionRecord(10, 4) for r in "abcd"}
    plan = setup(5, prev, dict.fromkeys("abcd", 20))
    outcomes = {r: written(plan, r) for r in "abc"} | {"d": failed("d")}
    d = decide(plan, outcomes, prev, POLICY)
    assert d.kind is EpochKind.REGIONAL
    assert set(d.committed) == {"a", "b", "c"}
    assert d.fallen_back == {"d": "boom"}
    assert d.regions["d"] == RegionRecord(10, 4, 1, RegionState.FALLEN_BACK, "boom")
    assert d.regions["d"].ref_epoch == 4
    assert d.regions["a"].committed_offset == 20 and d.regions["a"].current_epoch == 5


def test_idle_regions_are_neither_committed_nor_fallen_back():
    prev = {"a": RegionRecord(10, 2), "b": RegionRecord(5, 2)}
    plan = setup(3, prev, {"a": 10, "b": 8})
    d = decide(plan, {"b": written(plan, "b")}, prev, POLICY)
    assert d.kind is EpochKind.GLOBAL and set(d.committed) == {"b"} and not d.fallen_back
    assert d.regions["a"].current_epoch == 3


def test_more_failures_than_the_ratio_abort_the_epoch():
    prev = {r: RegionRecord(0, 0) for r in "abcd"}
    plan = setup(1, prev, dict.fromkeys("abcd", 5))
    outcomes = {"a": written(plan, "a"), "b": failed("b"), "c": failed("c"), "d": failed("d")}
    d = decide(plan, outcomes, prev, POLICY)
    assert d.kind is EpochKind.ABORTED and not d.committed
    assert set(d.fallen_back) == set("abcd") and "maxFailureRatio" in d.fallen_back["a"]
    assert d.regions["a"].consecutive_failures == 0  # not its fault
    assert d.regions["b"].consecutive_failures == 1


def test_exactly_the_ratio_is_still_regional():
    prev = {r: RegionRecord(0, 0) for r in "abcd"}
    plan = setup(1, prev, dict.fromkeys("abcd", 5))
    d = decide(plan, {"a": written(plan, "a"), "b": written(plan, "b"), "c": failed("c"), "d": failed("d")},
               prev, POLICY)
    assert d.kind is EpochKind.REGIONAL


def test_tier_one_forces_a_global_epoch_that_commits_when_all_succeed():
    prev = {"a": RegionRecord(5, 1), "b": RegionRecord(0, None, consecutive_failures=3,
                                                      state=RegionState.FALLEN_BACK)}
    plan = setup(4, prev, {"a": 9, "b": 9})
    d = decide(plan, {"a": written(plan, "a"), "b": written(plan, "b")}, prev, POLICY)
    assert d.kind is EpochKind.FORCED_GLOBAL and set(d.committed) == {"a", "b"}
    assert "maxConsecutiveFailures" in d.reason
    assert d.regions["b"].consecutive_failures == 0 and d.regions["b"].state is RegionState.OK


def test_tier_two_a_failed_forced_global_epoch_publishes_nothing_and_resets_counters():
    prev = {"a": RegionRecord(5, 1), "b": RegionRecord(0, None, consecutive_failures=3,
                                                      state=RegionState.FALLEN_BACK)}
    plan = setup(4, prev, {"a": 9, "b": 9})
    d = decide(plan, {"a": written(plan, "a"), "b": failed("b")}, prev, POLICY)
    assert d.kind is EpochKind.ABORTED and not d.committed
    assert "forced global epoch failed" in d.reason
    assert all(s.consecutive_failures == 0 for s in d.regions.values())
    assert d.regions["a"].committed_offset == 5 and d.regions["b"].committed_offset == 0
    assert d.regions["b"].ref_epoch == -1  # never committed: still on its initial offset
    # and the next epoch is an ordinary regional one again
    plan2 = setup(5, d.regions, {"a": 9, "b": 9})
    d2 = decide(plan2, {"a": written(plan2, "a"), "b": failed("b")}, d.regions, POLICY)
    assert d2.kind is EpochKind.REGIONAL


def test_an_explicit_force_reason_makes_the_epoch_forced_global():
    prev = {"a": RegionRecord(0, None)}
    plan = setup(0, prev, {"a": 3})
    d = decide(plan, {"a": written(plan, "a")}, prev, POLICY, force_reason="graceful stop")
    assert d.kind is EpochKind.FORCED_GLOBAL and d.reason == "graceful stop"


def test_disabled_means_all_or_nothing():
    policy = RegionalPolicy(enabled=False)
    prev = {r: RegionRecord(0, None) for r in "ab"}
    plan = setup(0, prev, {"a": 3, "b": 3})
    d = decide(plan, {"a": written(plan, "a"), "b": failed("b")}, prev, policy)
    assert d.kind is EpochKind.ABORTED and not d.committed


def test_quarantined_regions_are_marked():
    prev = {r: RegionRecord(0, None) for r in "abc"}
    plan = setup(0, prev, dict.fromkeys("abc", 3))
    d = decide(plan, {"a": written(plan, "a"), "b": written(plan, "b"), "c": failed("c", Status.QUARANTINED)},
               prev, POLICY)
    assert d.quarantined == {"c"} and d.regions["c"].state is RegionState.QUARANTINED


def test_a_committed_prefix_moves_the_offset_to_what_was_written():
    prev = {"a": RegionRecord(0, None)}
    plan = setup(0, prev, {"a": 100})
    d = decide(plan, {"a": RegionOutcome("a", Status.WRITTEN, 40, 40)}, prev, POLICY)
    assert d.committed == {"a": (0, 40, 40)} and d.regions["a"].committed_offset == 40
