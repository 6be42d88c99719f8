"""deadLetterRetries and deadLetterRetryBackoff (issue 30): a record is dead-lettered only after it failed alone, with
evidence that records beside it pass, in deadLetterRetries + 1 epochs, each retry planned no sooner than the backoff
after the failure before it. Failures without evidence (an outage) are no tries."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from regional.errors import RegionalConfigError
from regional.protocol.decide import Outcome, TaskOutcome, decide, outcomes_from_tasks
from regional.protocol.plan import EpochPlan, plan_epoch, retry_due
from regional.protocol.settings import DEFAULTS, Settings, resolve_settings
from regional.store import EpochKind, EpochRecord, RegionState, Standing
from regional.store.model import regions_from_columns, regions_to_columns
from regional.store.status import QueryStatus
from test_dead_letters import ATTEMPTS, record_bytes, run_attempts, with_dead_letters

T0 = 1_700_000_000.0


def waiting(offset: int = 37, tries: int = 1, at: float = T0) -> RegionState:
    """Region a, its record at ``offset`` isolated and failed alone ``tries`` times, the last at ``at``; it failed alone
    in epoch 7 and its probe passed in epoch 8, so its next failure alone (epoch 9 on) is a try."""
    return RegionState(offset, 3, 0, Standing.QUARANTINED, "failed alone", isolating=(offset, offset + 1),
                       failed_alone=tries, failed_alone_at=at, alone_since=7, probe_passed=8)


def planned(plan: EpochPlan) -> list[tuple[str, int, int, bool]]:
    return [(r.region, r.start, r.end, r.isolated) for r in plan.regions]


def test_the_settings_default_to_four_retries_a_minute_apart_and_bad_values_name_the_option():
    s = resolve_settings({}, {}, {})
    assert (s.dead_letter_retries, s.dead_letter_retry_backoff_s) == (4, 60.0)
    s = resolve_settings({"spark.regional.deadLetterRetries": "3"}, {"deadletterretrybackoff": "2 minutes"}, {})
    assert (s.dead_letter_retries, s.dead_letter_retry_backoff_s) == (3, 120.0)
    assert resolve_settings({}, {"deadLetterRetryBackoff": "0"}, {}).dead_letter_retry_backoff_s == 0.0
    for key, value, message in [("deadLetterRetries", "-1", r"deadLetterRetries=-1 is too small.*at least 0"),
                                ("deadLetterRetries", "two", r"deadLetterRetries='two' is not a whole number"),
                                ("deadLetterRetryBackoff", "soon", r"deadLetterRetryBackoff='soon' is not a duration"),
                                ("deadLetterRetryBackoff", "-5s", "deadLetterRetryBackoff")]:
        with pytest.raises(RegionalConfigError, match=message):
            resolve_settings({}, {key: value}, {})
    assert {"deadLetterRetries", "deadLetterRetryBackoff"} <= set(DEFAULTS)


def test_plans_and_records_written_before_the_options_still_decode():
    s = Settings.from_json({k: v for k, v in Settings(dead_letter_path="/d").to_json().items()
                            if not k.startswith("dead_letter_retr")})
    assert (s.dead_letter_retries, s.dead_letter_retry_backoff_s) == (0, 0.0)
    s = Settings(dead_letter_path="/d", dead_letter_retries=2, dead_letter_retry_backoff_s=1.5)
    assert Settings.from_json(s.to_json()) == s
    old = regions_to_columns({"a": RegionState(5, 1), "b": RegionState(0)})
    assert "failed_alone" not in old  # nothing waits: the record is written as before
    assert regions_from_columns(old) == {"a": RegionState(5, 1), "b": RegionState(0)}
    states = {"a": waiting(), "b": RegionState(9, 2)}
    assert regions_from_columns(regions_to_columns(states)) == states
    record = EpochRecord(4, EpochKind.REGIONAL, {}, {}, states, recorded_at=T0, dead_letter_retries=2,
                         dead_letter_retry_backoff_s=30.0)
    assert EpochRecord.from_json(record.to_json()) == record
    before = EpochRecord(4, EpochKind.GLOBAL, {}, {}, {"b": RegionState(9, 2)}).to_json()
    assert "dead_letter_retries" not in before and EpochRecord.from_json(before).dead_letter_retries == 0


def test_a_record_is_dead_lettered_on_its_last_try_each_retry_no_sooner_than_the_backoff():
    """Poison at a37 among 120; b has work in every epoch (evidence). deadLetterRetries=2, backoff 60 s, an epoch
    every 7 s: a's record fails alone three times, at least 60 s apart, then is dead-lettered once."""
    s = with_dead_letters(dead_letter_retries=2, dead_letter_retry_backoff_s=60.0)
    record, now, available = None, T0, {"a": 120, "b": 0}
    failed_alone, letters = [], []
    for epoch in range(80):
        available["b"] += 3
        plan = plan_epoch(epoch, "q", "ck", record.regions if record else {}, available, s, now=now)
        assert "b" in {r.region for r in plan.regions}  # the other region is never held up
        record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, {"a": {37: math.inf}})), record, now=now)
        assert record.kind is not EpochKind.ABORTED and "b" in record.committed
        a = record.regions["a"]
        if "a" in record.fallen_back and a.failed_alone > len(failed_alone):  # a try
            failed_alone.append(now)
            assert a.failed_alone == len(failed_alone) and a.failed_alone_at == now and a.isolating == (37, 38)
            assert f"failed alone {len(failed_alone)} of 3 times" in a.reason and "retried after" in a.reason
        if "a" in record.fallen_back:
            assert a.consecutive_failures == 0  # records of a beside it pass: no failure of the region
        letters += [(epoch, now, d.offset) for d in record.dead_lettered.values()]
        if letters:
            break
        now += 7.0
    assert len(failed_alone) == 2 and [o for _, _, o in letters] == [37]
    assert failed_alone[1] - failed_alone[0] >= 60.0 and letters[0][1] - failed_alone[1] >= 60.0
    a = record.regions["a"]
    assert (a.committed_offset, a.dead_letters, a.failed_alone, a.failed_alone_at) == (38, 1, 0, None)


def test_a_waiting_region_is_not_planned_until_its_retry_is_due_nor_in_a_graceful_stop():
    s = with_dead_letters(dead_letter_retries=1, dead_letter_retry_backoff_s=60.0)
    states = {"a": waiting(), "b": RegionState(0)}
    assert retry_due(states["a"], s) == T0 + 60.0
    assert planned(plan_epoch(9, "q", "ck", states, {"a": 120, "b": 5}, s, now=T0 + 59.9)) == [("b", 0, 5, False)]
    early = plan_epoch(9, "q", "ck", states, {"a": 120}, s, ends={"a": 120}, now=T0 + 59.9)
    assert not early.regions and not early.final  # a bounded input is not done while a retry is pending
    assert planned(plan_epoch(9, "q", "ck", states, {"a": 120, "b": 5}, s, now=T0 + 60.0)) == [
        ("a", 37, 38, True), ("b", 0, 5, False)]
    stop = plan_epoch(9, "q", "ck", states, {"a": 120, "b": 5}, s, force_reason="stop", now=T0 + 600)
    assert planned(stop) == [("b", 0, 5, False)]
    # a restart with a shorter backoff shortens the wait (the plan's settings are the run's)
    shorter = with_dead_letters(dead_letter_retries=1, dead_letter_retry_backoff_s=1.0)
    assert planned(plan_epoch(9, "q", "ck", states, {"a": 120}, shorter, now=T0 + 2)) == [("a", 37, 38, True)]


def test_a_record_that_passes_on_a_retry_is_committed_and_its_count_reset():
    s = with_dead_letters(dead_letter_retries=3, dead_letter_retry_backoff_s=10.0)
    previous = EpochRecord(8, EpochKind.REGIONAL, {}, {}, {"a": waiting(tries=2)}, recorded_at=T0)
    plan = plan_epoch(9, "q", "ck", previous.regions, {"a": 120}, s, now=T0 + 10)
    assert planned(plan) == [("a", 37, 38, True)]
    record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, {})), previous, now=T0 + 10)
    assert record.committed["a"].start == 37 and not record.dead_lettered
    a = record.regions["a"]
    assert (a.committed_offset, a.state, a.failed_alone, a.failed_alone_at, a.isolating) == (
        38, Standing.OK, 0, None, None)
    assert planned(plan_epoch(10, "q", "ck", record.regions, {"a": 120}, s, now=T0 + 10)) == [("a", 38, 120, False)]


def test_a_failure_without_evidence_is_no_try():
    """The record fails alone, but nothing beside it passes (no neighbours read: the region's only record; other
    regions are no evidence): an outage by the rule. It is neither dead-lettered nor counted as a try, even on what
    would be its last try; it waits a short back-off. Records after it arrive: they pass, then it fails alone again:
    that is its last try, dead-lettered."""
    s = with_dead_letters(dead_letter_retries=1, dead_letter_retry_backoff_s=5.0)
    previous = EpochRecord(8, EpochKind.REGIONAL, {}, {}, {"a": waiting(offset=0, tries=1)._replace(
        probe_passed=None), "b": RegionState(0, 8)}, recorded_at=T0)
    plan = plan_epoch(9, "q", "ck", previous.regions, {"a": 1, "b": 5}, s, now=T0 + 5)
    assert planned(plan) == [("a", 0, 1, True), ("b", 0, 5, False)] and not plan.probes
    record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, {"a": {0: math.inf}})), previous, now=T0 + 5)
    a = record.regions["a"]
    assert not record.dead_lettered and "no neighbour in its region to try" in (a.reason or "")
    assert "looks like an outage" in a.reason and "b" in record.committed  # b passing is no evidence
    assert (a.failed_alone, a.failed_alone_at, a.alone_waits, a.consecutive_failures) == (1, T0 + 5, 1, 1)
    assert retry_due(a, s) == T0 + 6  # a short back-off, not deadLetterRetryBackoff
    plan = plan_epoch(10, "q", "ck", record.regions, {"a": 3}, s, now=T0 + 6)
    assert [(r.start, r.end) for r in plan.probes] == [(1, 2), (2, 3)]  # records after it, each on its own
    record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, {"a": {0: math.inf}})), record, now=T0 + 6)
    assert not record.dead_lettered and record.regions["a"].probe_passed == 10
    assert record.regions["a"].consecutive_failures == 1  # evidence gathered: no failure of the region
    plan = plan_epoch(11, "q", "ck", record.regions, {"a": 3}, s, now=T0 + 8)
    record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, {"a": {0: math.inf}})), record, now=T0 + 8)
    assert record.dead_lettered["a"].offset == 0 and record.regions["a"].failed_alone == 0


def test_a_retry_is_not_an_outage_and_does_not_count_towards_max_failure_ratio():
    """Only a's isolated record fails, its probe passes: the epoch is not aborted (maxFailureRatio=0), no backoff."""
    s = with_dead_letters(dead_letter_retries=1, max_failure_ratio=0.0)
    states = {"a": waiting(tries=0)._replace(failed_alone_at=None)}
    plan = plan_epoch(9, "q", "ck", states, {"a": 50}, s, now=T0)
    assert planned(plan) == [("a", 37, 38, True)] and plan.probes
    record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, {"a": {37: math.inf}})),
                    EpochRecord(8, EpochKind.REGIONAL, {}, {}, states), now=T0)
    assert record.kind is not EpochKind.ABORTED and record.outage_epochs == 0 and not record.dead_lettered
    assert record.fallen_back["a"].quarantined and record.regions["a"].failed_alone == 1


def test_the_dead_letter_brake_counts_dead_letters_not_retries():
    s = with_dead_letters(dead_letter_retries=1, max_dead_letters_per_epoch=0)
    states = {r: waiting(tries=0)._replace(failed_alone_at=None) for r in "ab"}
    plan = plan_epoch(9, "q", "ck", states, {"a": 50, "b": 50}, s, now=T0)
    tasks = [TaskOutcome(i, ATTEMPTS, Outcome.QUARANTINED, "q", rr.region, rr.start, rr.start,
                         dead_letter=record_bytes(rr.region, rr.start)) if not rr.probe else
             TaskOutcome(i, 0, Outcome.WRITTEN, "q", rr.region, rr.start, rr.end, rr.end - rr.start, rr.start,
                         rr.end - 1, "p") for i, rr in enumerate(plan.ranges)]
    record = decide(plan, outcomes_from_tasks(plan, tasks), EpochRecord(8, EpochKind.REGIONAL, {}, {}, states), now=T0)
    assert not record.dead_lettered and {r: s.failed_alone for r, s in record.regions.items()} == {"a": 1, "b": 1}


def test_status_shows_a_record_waiting_for_its_retry():
    record = EpochRecord(8, EpochKind.REGIONAL, {}, {}, {"a": waiting(tries=1), "b": RegionState(3, 8)},
                         recorded_at=T0, dead_letter_retries=2, dead_letter_retry_backoff_s=60.0)
    st = QueryStatus("ck", record.regions, [record], now=T0 + 10)
    assert st.retry("a") == (1, 3, T0 + 60.0) and st.retry("b") is None
    assert st.to_json()["regions"]["a"]["retry"] == {"offset": 37, "tries": 1, "of": 3, "due_at": T0 + 60.0}
    assert st.progress().retries_pending == 1
    from regional.cli.status import render
    assert "offset 37 failed alone 1 of 3 tries; next try at " in render(st) and "(in 50s)" in render(st)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 120), poison=st.sets(st.integers(0, 119), max_size=3),
       transient=st.dictionaries(st.integers(0, 119), st.integers(1, 4 * ATTEMPTS), max_size=3),
       retries=st.integers(0, 3), backoff=st.sampled_from([0.0, 5.0, 30.0]), step=st.sampled_from([1.0, 4.0]))
def test_only_records_failing_alone_on_every_try_are_dead_lettered_and_every_other_record_is_published_once(
        n, poison, transient, retries, backoff, step):
    """Beside a healthy region with work in every epoch: each poison record is dead-lettered once, after it failed
    alone ``retries`` times, the last of them at least ``backoff`` earlier; a record that fails fewer times than
    (retries + 1) * regionAttempts is never dead-lettered; every other record is committed once, in order."""
    poison = {p for p in poison if p < n}
    # A region of nothing but poison has no witness: no proof is possible, and without suspectTimeout (these settings
    # have none) it waits, as designed (test_poison_bounded drains such a region with the bound's policy).
    assume(len(poison) < n)
    fails = {"p": {**{o: t for o, t in transient.items() if o < n}, **{o: math.inf for o in poison}}}
    s = with_dead_letters(dead_letter_retries=retries, dead_letter_retry_backoff_s=backoff)
    available, now = {"p": n, "h": 1}, T0
    record, published, dead, alone, tries = None, {"p": [], "h": []}, [], {}, 0
    for epoch in range(3000):
        if record is not None and record.regions["p"].committed_offset == n:
            break
        available["h"] += 1
        plan = plan_epoch(epoch, "q", "ck", record.regions if record else {}, available, s, now=now)
        record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, fails)), record, now=now)
        for region, sl in record.committed.items():
            published[region] += list(range(sl.start, sl.end))
        p = record.regions["p"]
        if "p" in record.fallen_back and p.failed_alone > tries:  # a try
            alone.setdefault(p.committed_offset, []).append(now)
        tries = p.failed_alone
        for d in record.dead_lettered.values():
            dead.append(d.offset)
            times = alone.get(d.offset, [])
            assert len(times) == retries and (not times or now - times[-1] >= backoff)
        now += step
    else:
        raise AssertionError("not done within 3000 epochs")
    assert sorted(dead) == dead and set(dead) >= poison and len(set(dead)) == len(dead)
    assert all(o in poison or transient.get(o, 0) >= (retries + 1) * ATTEMPTS for o in dead)
    assert sorted(published["p"] + dead) == list(range(n)) and published["p"] == sorted(published["p"])
    assert published["h"] == list(range(len(published["h"])))


def test_settings_changed_between_restarts_keep_the_tries_so_far():
    """A restart plans with its own settings; the record's tries so far come from the epoch record. Fewer retries
    than it has used: dead-lettered on its next failure alone (never lost, never kept forever); more: it waits
    again, its count going on."""
    previous = EpochRecord(8, EpochKind.REGIONAL, {}, {}, {"a": waiting(tries=2), "b": RegionState(0)},
                           recorded_at=T0)
    for retries, dead in [(1, True), (2, True), (3, False)]:
        s = with_dead_letters(dead_letter_retries=retries, dead_letter_retry_backoff_s=1.0)
        plan = plan_epoch(9, "q", "ck", previous.regions, {"a": 120, "b": 4}, s, now=T0 + 1)
        record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, {"a": {37: math.inf}})), previous,
                        now=T0 + 1)
        assert bool(record.dead_lettered) is dead
        assert record.regions["a"].failed_alone == (0 if dead else 3)


def test_a_waiting_region_the_source_no_longer_has_makes_no_empty_epochs(tmp_path):
    """A record waiting for its retry whose region is gone from the source (a topic deleted, failOnDataLoss=false)
    is never planned again: the reader hands Spark its own offset back ("nothing new"), not an empty epoch after
    another (found by a cold review: ~5 empty epochs a second, and AvailableNow never ended)."""
    import time as clock

    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from regional.spark.reader import RegionalStreamReader
    from regional.store import EpochKind, EpochRecord, RegionState, Standing, Store

    store = Store(str(tmp_path))
    query_id = store.open_query()
    store.record_write_options("run", {"deadLetterPath": str(tmp_path / "dlq"), "deadLetterRetries": "2",
                                       "deadLetterRetryBackoff": "1s"})
    now = clock.time()
    waiting = RegionState(37, 3, 0, Standing.QUARANTINED, "failed alone", isolating=(37, 38), failed_alone=1,
                          failed_alone_at=now - 100)
    store.write_record(EpochRecord(0, EpochKind.REGIONAL, {}, {}, {"g000": waiting, "g001": RegionState(100, 0)},
                                   recorded_at=now))
    reader = RegionalStreamReader({}, {"source": "generator", "regions": "2", "rowsPerEpoch": "100",
                                       "totalRows": "100", "checkpointlocation": str(tmp_path)})
    reader.input.available = lambda epoch: {"g001": 100}  # type: ignore[method-assign]  # g000 is gone
    start = {"query_id": query_id, "epoch": 0}
    assert reader.latestOffset(start, ReadAllAvailable()) == start


def test_a_region_that_moved_past_lost_records_does_not_inherit_the_lost_records_tries():
    """Found by a cold review: a record waiting with one try used was lost to retention (failOnDataLoss=false) in an
    epoch the region fell back; the record next at the region's start was then dead-lettered on its first failure
    alone, without its retries."""
    from regional.protocol.decide import own_evidence
    from regional.protocol.plan import RegionRange, Retention

    s = with_dead_letters(dead_letter_retries=1, dead_letter_retry_backoff_s=60.0)
    rec = EpochRecord(9, EpochKind.REGIONAL, {}, {}, {"a": waiting(37, 1, T0), "b": RegionState(0)}, recorded_at=T0)
    plan = plan_epoch(10, "q", "ck", rec.regions, {"a": 200, "b": 10}, s,
                      retention=Retention({"a": 100, "b": 0}, False), now=T0 + 30)
    assert plan.lost == {"a": (37, 100)}
    rec = decide(plan, outcomes_from_tasks(plan, [None, None]), rec, now=T0 + 30)  # its tasks reported nothing
    a = rec.regions["a"]
    assert (a.committed_offset, a.failed_alone, a.failed_alone_at, a.alone_since, a.probe_passed) == (
        100, 0, None, None, None)
    assert own_evidence(rec.regions["a"], RegionRange("a", 100, 101, None, True)).failed_alone == 0
    assert own_evidence(waiting(37, 1, T0), RegionRange("a", 100, 101, None, True)).alone_since is None


def test_a_failure_time_ahead_of_the_clock_counts_as_now_and_nothing_failing_alone_means_no_wait():
    ahead = waiting(37, 1, T0 + 30 * 86400)  # recorded by a clock that was a month ahead
    assert retry_due(ahead, with_dead_letters(dead_letter_retries=2, dead_letter_retry_backoff_s=5.0), T0) == T0 + 5
    # a failure alone that was no try waits the short back-off (1 s, doubling, at most 10 s), whatever the settings
    assert retry_due(ahead._replace(alone_waits=3), with_dead_letters(dead_letter_retry_backoff_s=60.0), T0) == T0 + 4
    assert retry_due(ahead._replace(failed_alone=0), with_dead_letters(dead_letter_retry_backoff_s=5.0), T0) is None
    plan = plan_epoch(5, "q", "ck", {"a": ahead, "b": RegionState(0)}, {"a": 100, "b": 10},
                      with_dead_letters(dead_letter_retries=2, dead_letter_retry_backoff_s=0.0), now=T0)
    assert [r.region for r in plan.regions] == ["a", "b"]
    # status says what the plan does (it had its own sum, without the clock's clamp: a month away)
    record = EpochRecord(8, EpochKind.REGIONAL, {}, {}, {"a": ahead}, recorded_at=T0, dead_letter_retries=2,
                         dead_letter_retry_backoff_s=5.0)
    assert QueryStatus("ck", record.regions, [record], now=T0).retry("a") == (1, 3, T0 + 5)


def test_a_backoff_longer_than_a_month_is_refused():
    with pytest.raises(RegionalConfigError, match="deadLetterRetryBackoff='99999999 hours' is longer than 30 days"):
        resolve_settings({}, {"deadLetterPath": "/d", "deadLetterRetries": "1",
                              "deadLetterRetryBackoff": "99999999 hours"}, {})
