"""Poison told from outage (issue 45), pure: plan and decide over a simulated clock, no Spark.

A service the query's UDF calls is down for random wall-clock windows that start and end anywhere: between epochs,
in the middle of one, between two attempts of one task. A window's scope is every region, some, or one. Real poison
records are spread at random. Whatever the windows: no healthy record is dead-lettered, every poison record is
dead-lettered exactly once, every other record is published exactly once in offset order, and the bounded query
ends. The only way to fool the rule is a region whose service goes down again and again while one record is
isolated: deadLetterRetries + 2 separate outages (docs/design.md, "Poison or outage"); windows that overlap one region
fewer times than that must never dead-letter a healthy record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from regional.protocol.decide import Outcome, TaskOutcome, decide, outcomes_from_tasks, with_failure_causes
from regional.protocol.plan import PROBE_SPAN, EpochPlan, plan_epoch
from regional.protocol.settings import Settings
from regional.store import EpochRecord
from regional.store.model import TaskFailure
from support import attempt_moments, python_traceback

REGIONS = ("a", "b", "c", "d")
ATTEMPTS = 2
CORES = 4
TASK_S = 0.7  # a task attempt's duration: epochs take seconds, windows cut through them and through attempts


@dataclass
class Service:
    """Down for region r at time t when a window holding r holds t."""

    windows: list[tuple[float, float, frozenset[str]]]

    def down(self, region: str, t: float) -> bool:
        return any(lo <= t < hi and region in scope for lo, hi, scope in self.windows)

    def outages(self, region: str) -> int:
        """Separate stretches of time in which the region's service is down (overlapping windows are one)."""
        spans = sorted((lo, hi) for lo, hi, scope in self.windows if region in scope and hi > lo)
        count, end = 0, -math.inf
        for lo, hi in spans:
            if lo > end:
                count += 1
            end = max(end, hi)
        return count


@dataclass
class Run:
    service: Service
    poison: dict[str, set[int]]
    sizes: dict[str, int]
    settings: Settings
    now: float = 0.0
    record: EpochRecord | None = None
    published: dict[str, list[int]] = field(default_factory=dict)
    dead: dict[str, list[int]] = field(default_factory=dict)
    letter_times: list[float] = field(default_factory=list)

    def tasks(self, plan: EpochPlan) -> list[TaskOutcome]:
        """Every range (regions' and probes') runs on CORES slots; each attempt at its own moment. An attempt fails
        when the service is down for its region at that moment, or at a poison record in its range."""
        out, finish = [], self.now
        for i, rr in enumerate(plan.ranges):
            failed = 0
            for t in attempt_moments(self.now, i, CORES, ATTEMPTS, TASK_S):
                finish = max(finish, t + TASK_S)
                if rr.end > rr.start and (self.service.down(rr.region, t)
                                          or self.poison[rr.region] & set(range(rr.start, rr.end))):
                    failed += 1
                else:
                    break
            if failed == ATTEMPTS:  # the quarantined attempt: reads an isolated record to dead-letter it
                out.append(TaskOutcome(i, ATTEMPTS, Outcome.QUARANTINED, plan.query_id, rr.region, rr.start,
                                       rr.start, reason=f"ValueError: {rr.region}@{rr.start}",
                                       dead_letter=b"record" if rr.isolated else None))
            else:
                out.append(TaskOutcome(i, failed, Outcome.WRITTEN, plan.query_id, rr.region, rr.start, rr.end,
                                       rr.end - rr.start, rr.start, rr.end - 1, f"{rr.region}@{rr.start}"))
        self.now = finish + 0.2  # the driver decides and records
        return out

    def outcomes(self, plan: EpochPlan) -> dict:
        return outcomes_from_tasks(plan, self.tasks(plan))

    def epoch(self, epoch: int) -> EpochPlan:
        states = self.record.regions if self.record else {}
        plan = plan_epoch(epoch, "q", "ck", states, self.sizes, self.settings, ends=self.sizes, now=self.now)
        if not plan.regions:
            dues = [d for s in states.values() if (d := s_due(s, self.settings, self.now)) is not None]
            if dues:  # the source waits for the first retry due, as the reader does, then plans again
                self.now = max(self.now, min(dues)) + 0.01
                return self.epoch(epoch)
            return plan
        self.record = decide(plan, self.outcomes(plan), self.record, now=self.now)
        for region, sl in self.record.committed.items():
            self.published[region] += range(sl.start, sl.end)
        for region, letter in self.record.dead_lettered.items():
            self.dead[region].append(letter.offset)
            self.letter_times.append(self.now)
        self.now += self.record.backoff_s  # an outage's back-off between epochs
        return plan


def s_due(state, s: Settings, now: float) -> float | None:
    from regional.protocol.plan import retry_due  # present before issue 45 too, with another meaning

    return retry_due(state, s, now)


def done(run: Run) -> bool:
    regions = run.record.regions if run.record else {}
    return all(r in regions and regions[r].committed_offset >= n for r, n in run.sizes.items()) and \
        run.record is not None and run.record.whole


windows = st.lists(
    st.tuples(st.floats(0, 150), st.floats(0.05, 90),
              st.sampled_from([REGIONS, REGIONS[:2], REGIONS[1:3], ("a",), ("c",), ("d",)])),
    max_size=3)


@st.composite
def inputs(draw):
    sizes = {r: draw(st.integers(2, 40)) for r in REGIONS}
    poison = {r: draw(st.sets(st.integers(0, sizes[r] - 1), max_size=4)) for r in REGIONS}
    for r, bad in poison.items():  # each poison record has a healthy record near it, or nothing can prove it
        for p in bad:
            assume(any(o not in bad for o in range(max(0, p - PROBE_SPAN), min(sizes[r], p + PROBE_SPAN + 1))))
    return sizes, poison


def simulate(sizes, poison, spans, retries: int, backoff: float, ratio: float = 1.0) -> Run:
    service = Service([(lo, lo + length, frozenset(scope)) for lo, length, scope in spans])
    s = Settings(dead_letter_path="/dead", region_attempts=ATTEMPTS, max_failure_ratio=ratio,
                 dead_letter_retries=retries, dead_letter_retry_backoff_s=backoff, max_dead_letters_per_epoch=10)
    run = Run(service, poison, sizes, s, published={r: [] for r in REGIONS}, dead={r: [] for r in REGIONS})
    for epoch in range(600):
        plan = run.epoch(epoch)
        if done(run) or not plan.regions:
            break
    return run


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(inputs(), windows, st.sampled_from([0, 1, 2]), st.sampled_from([0.0, 3.0, 60.0]))
def test_outages_of_any_scope_and_timing_dead_letter_no_healthy_record(data, spans, retries, backoff):
    sizes, poison = data
    run = simulate(sizes, poison, spans, retries, backoff)
    assert done(run), f"the bounded query did not end: {run.record.regions if run.record else None}"
    for r in REGIONS:
        healthy_letters = [o for o in run.dead[r] if o not in poison[r]]
        if run.service.outages(r) <= retries + 1:  # fewer outages than it takes to fool deadLetterRetries
            assert not healthy_letters, f"healthy {r}@{healthy_letters} dead-lettered ({run.service.windows})"
        assert sorted(set(run.dead[r]) & poison[r]) == sorted(poison[r])  # every poison record,
        assert len(run.dead[r]) == len(set(run.dead[r]))  # once
        assert run.published[r] == sorted(set(range(sizes[r])) - set(run.dead[r]))  # the rest once, in order


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(0, 60), st.floats(0.05, 400), st.sampled_from([REGIONS, REGIONS[:2], ("b",)]))
def test_the_defaults_ride_out_any_one_outage_and_still_dead_letter_poison(start, length, scope):
    """deadLetterRetries and deadLetterRetryBackoff as shipped; one outage of up to ~7 minutes, with poison b@5,
    b@9 and c@3 (issue 45's third scenario) in 20-record regions."""
    from regional.protocol.settings import resolve_settings

    s = resolve_settings({}, {"deadLetterPath": "/dead"}, {})
    sizes = dict.fromkeys(REGIONS, 20)
    poison = {"a": set(), "b": {5, 9}, "c": {3}, "d": set()}
    run = simulate(sizes, poison, [(start, length, scope)], s.dead_letter_retries, s.dead_letter_retry_backoff_s)
    assert done(run)
    assert run.dead == {"a": [], "b": [5, 9], "c": [3], "d": []}
    for r in REGIONS:
        assert run.published[r] == sorted(set(range(20)) - poison[r])


def test_the_issues_scenarios_on_a_timer():
    """Issue 45's three failures: (1) every region down for about a minute, (2) two of four regions down, the outage
    ending at every moment of a 15-s sweep (in the middle of epochs, between a task's attempts: before issue 45,
    ending at 66.3 s dead-lettered a@0, b@0 and c@0, at 56.5 s with two regions down a@0 and b@0); (3) poison b@5, b@9
    and c@3, no outage, retries off: each poison record dead-lettered once, and the query ends."""
    sizes = dict.fromkeys(REGIONS, 16)
    none: dict[str, set[int]] = {r: set() for r in REGIONS}
    for scope in (REGIONS, REGIONS[:2]):
        for k in range(75):
            run = simulate(sizes, none, [(0.0, 55.0 + k * 0.2, scope)], 0, 0.0)
            assert done(run) and run.dead == {r: [] for r in REGIONS}, (scope, 55.0 + k * 0.2, run.dead)
            assert all(run.published[r] == list(range(16)) for r in REGIONS)
    run = simulate(dict.fromkeys(REGIONS[:3], 20), {"a": set(), "b": {5, 9}, "c": {3}}, [], 0, 0.0)
    assert done(run) and {r: v for r, v in run.dead.items() if v} == {"b": [5, 9], "c": [3]}


def test_probes_skip_records_already_dead_lettered_and_split_after_a_failure_alone():
    """Issue 45's third failure: b@9's probe held b@5, already dead-lettered, so it failed for ever. A poison record
    stays poison: it is no neighbour."""
    from regional.protocol.plan import probe_ranges

    assert probe_ranges(9, 20, 0) == [(1, 9)]
    assert probe_ranges(9, 20, 0, poison=(5,)) == [(6, 9)]  # the run nearest it
    assert probe_ranges(9, 20, 0, poison=(8,)) == [(1, 8)]
    assert probe_ranges(9, 20, 0, poison=tuple(range(1, 9))) == [(10, 18)]  # none before: the records after it
    assert probe_ranges(0, 20, 0) == [(1, 9)]
    # After a failure alone without witness (issue 55): ranges of one size before it, after it and at its region's
    # end, a size larger with each wait (1, 2, 4, ...), known poison left out
    assert probe_ranges(0, 20, 0, waits=1) == [(1, 2), (2, 3), (3, 4), (19, 20), (18, 19), (17, 18)]
    assert probe_ranges(0, 5, 0, waits=1) == [(1, 2), (2, 3), (3, 4), (4, 5)]  # past a burst at its start
    assert probe_ranges(30, 100, 0, waits=3, poison=(27,)) == [
        (26, 27), (28, 30), (22, 26), (18, 22), (31, 35), (35, 39), (39, 43), (96, 100), (92, 96), (88, 92)]
    # the burst it dead-lettered just before it is passed over, not probed
    assert probe_ranges(30, 100, 0, waits=3, poison=(28, 29))[:3] == [(24, 28), (20, 24), (16, 20)]
    assert probe_ranges(0, 1, 0, waits=5) == [] and probe_ranges(0, 3, 0, waits=9) == [(1, 3)]
    assert probe_ranges(0, 10, 0, waits=10) == probe_ranges(0, 10, 0, waits=1)  # the sizes cycle


def test_a_restart_decides_the_same_from_what_the_store_kept():
    """The evidence lives in the epoch record: a run whose record goes through the store's JSON after every epoch (as
    a restarted driver reads it) decides every epoch the same, dead letters and all."""
    sizes = dict.fromkeys(REGIONS, 20)
    poison = {"a": set(), "b": {5, 9}, "c": {0, 1}, "d": set()}
    spans = [(1.0, 9.0, ("c",)), (12.0, 20.0, REGIONS)]
    plain = simulate(sizes, poison, spans, 1, 3.0)

    class Restarting(Run):
        def epoch(self, epoch: int) -> EpochPlan:
            if self.record is not None:
                self.record = EpochRecord.from_json(self.record.to_json())
            return super().epoch(epoch)

    s = plain.settings
    again = Restarting(Service([(lo, lo + n, frozenset(sc)) for lo, n, sc in spans]), poison, sizes, s,
                       published={r: [] for r in REGIONS}, dead={r: [] for r in REGIONS})
    for epoch in range(600):
        plan = again.epoch(epoch)
        if done(again) or not plan.regions:
            break
    assert done(plain) and plain.dead == again.dead == {"a": [], "b": [5, 9], "c": [0, 1], "d": []}
    assert plain.published == again.published and plain.record == again.record


def test_records_of_the_previous_version_decode_without_evidence():
    from regional.store.model import RegionState, Standing, regions_from_columns, regions_to_columns

    old = {"id": ["a"], "committed_offset": [37], "last_epoch": [3], "consecutive_failures": [0],
           "state": ["quarantined"], "reason": ["q"], "isolating": [[37, 38]], "dead_letters": [1],
           "timed_range": [None], "failed_alone": [1], "failed_alone_at": [5.0]}  # as 8411f30 writes it
    a = regions_from_columns(old)["a"]
    assert (a.failed_alone, a.failed_alone_at, a.alone_since, a.probe_passed, a.alone_waits, a.poison) == (
        1, 5.0, None, None, 0, ())
    new = {"a": a._replace(alone_since=4, probe_passed=6, alone_waits=2, poison=(33,), first_seen_epoch=0,
                           first_seen_at=1.5), "b": RegionState(0, None, 0, Standing.OK)}
    assert regions_from_columns(regions_to_columns(new)) == new
    assert set(regions_to_columns({"b": RegionState(3, 1)})) == {  # a healthy query writes no new column
        "id", "committed_offset", "last_epoch", "consecutive_failures", "state", "reason", "isolating",
        "dead_letters", "timed_range"}


def test_status_says_a_region_waits_on_what_looks_like_an_outage_and_ages_a_new_region_from_when_it_was_seen():
    from regional.cli.status import render
    from regional.store.model import EpochKind, RegionState, Standing
    from regional.store.status import QueryStatus

    t0 = 1_700_000_000.0
    sizes = {"a": 10, "b": 10}
    s = Settings(dead_letter_path="/dead", region_attempts=ATTEMPTS)
    run = Run(Service([(t0, t0 + 1e9, frozenset({"a"}))]), {"a": set(), "b": set()}, sizes, s, now=t0,
              published={"a": [], "b": []}, dead={"a": [], "b": []})
    for epoch in range(12):
        run.epoch(epoch)
    a = run.record.regions["a"]
    assert a.alone_waits and "looks like an outage, not poison" in (a.reason or "")
    st = QueryStatus("ck", run.record.regions, [run.record], now=run.now)
    assert st.waiting("a")[0] == "outage" and st.waiting("b") is None
    assert st.to_json()["regions"]["a"]["waiting"]["looks_like"] == "outage"
    assert st.progress().outage_suspects == 1 and st.progress().dead_letters == 0
    assert "WAITING, looks like an outage, not poison" in render(st)
    # a region that never committed: its ref_epoch -1 is as old as when it was first seen, not as the query
    late = RegionState(0, None, 3, Standing.FALLEN_BACK, "down", first_seen_epoch=40, first_seen_at=t0 - 120)
    record = EpochRecord(41, EpochKind.REGIONAL, {}, {}, {"n": late}, recorded_at=t0)
    st = QueryStatus("ck", record.regions, [record], created_at=t0 - 86400, now=t0)
    assert st.ref_age("n") == (2, 120.0)
    before = late._replace(first_seen_epoch=None, first_seen_at=None)  # written before: as old as the query
    assert QueryStatus("ck", {"n": before}, [record], created_at=t0 - 86400, now=t0).ref_age("n") == (42, 86400.0)


# -- The user's own verdict (issue 55): deadLetterOn and outageOn --------------------------------------------------


@dataclass
class NamedRun(Run):
    """A run whose failed attempts leave the JVM shim's failure records: the UDF parses the record first (a poison
    record raises ``ValueError``, whatever the service), then calls the service (``ConnectionError`` while down)."""

    epochs: int = 0

    def outcomes(self, plan: EpochPlan) -> dict:
        failures: dict[int, list[TaskFailure]] = {}
        moment = self.now
        for i, rr in enumerate(plan.ranges):
            for k, t in enumerate(attempt_moments(moment, i, CORES, ATTEMPTS, TASK_S)):
                bad = sorted(self.poison[rr.region] & set(range(rr.start, rr.end)))
                if bad:
                    line = f"ValueError: cannot parse {rr.region}@{bad[0]}"
                elif rr.end > rr.start and self.service.down(rr.region, t):
                    line = f"ConnectionError: {rr.region}'s service is down"
                else:
                    break
                failure = TaskFailure(i, k, "1", PYTHON_EXCEPTION, line, python_traceback(line))
                failures.setdefault(i, []).append(failure)
        self.epochs += 1
        return with_failure_causes(plan, outcomes_from_tasks(plan, self.tasks(plan)), failures)


PYTHON_EXCEPTION = "org.apache.spark.api.python.PythonException"


def simulate_named(sizes, poison, spans, dead_letter_on=("ValueError",), outage_on=("ConnectionError",),
                   retries: int = 4, backoff: float = 60.0, epochs: int = 600) -> NamedRun:
    service = Service([(lo, lo + length, frozenset(scope)) for lo, length, scope in spans])
    s = Settings(dead_letter_path="/dead", region_attempts=ATTEMPTS, max_failure_ratio=1.0,
                 dead_letter_retries=retries, dead_letter_retry_backoff_s=backoff, max_dead_letters_per_epoch=10,
                 dead_letter_on=tuple(dead_letter_on), outage_on=tuple(outage_on))
    run = NamedRun(service, poison, sizes, s, published={r: [] for r in sizes}, dead={r: [] for r in sizes})
    for epoch in range(epochs):
        plan = run.epoch(epoch)
        if done(run) or not plan.regions:
            break
    return run


many_windows = st.lists(
    st.tuples(st.floats(0, 300), st.floats(0.05, 120),
              st.sampled_from([REGIONS, REGIONS[:2], REGIONS[1:3], ("a",), ("c",), ("d",)])),
    max_size=8)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(inputs(), many_windows, st.sampled_from([0, 1]), st.sampled_from([0.0, 3.0]))
def test_outage_on_never_dead_letters_a_healthy_record_however_many_outages(data, spans, retries, backoff):
    """With outageOn naming the outage's class, no number of outages fools the rule, even with the weakest evidence
    rule (deadLetterRetries=0, no backoff: two outages suffice without outageOn); poison still goes to the dead
    letters (by the evidence rule: deadLetterOn is not set here), every other record is published once, in order."""
    sizes, poison = data
    run = simulate_named(sizes, poison, spans, dead_letter_on=(), retries=retries, backoff=backoff)
    assert done(run), f"the bounded query did not end: {run.record.regions if run.record else None}"
    for r in REGIONS:
        assert not [o for o in run.dead[r] if o not in poison[r]], (r, run.dead[r], poison[r], run.service.windows)
        assert sorted(run.dead[r]) == sorted(poison[r]) and len(run.dead[r]) == len(set(run.dead[r]))
        assert run.published[r] == sorted(set(range(sizes[r])) - poison[r])


@st.composite
def bursts(draw):
    """Poison in bursts of consecutive records (1, 8, 9, 17 or up to 100) at a region's start, middle or end, with no
    healthy neighbour needed: a region may hold nothing but poison. One region of up to 120 records, the others up
    to 40 (each poison record is isolated on its own: the epochs add up)."""
    sizes, poison = {}, {}
    for r in REGIONS:
        n = draw(st.integers(1, 120 if r == "a" else 40))
        bad: set[int] = set()
        for _ in range(draw(st.integers(0, 2))):
            length = min(n, draw(st.sampled_from([1, 8, 9, 17, draw(st.integers(1, 100))])))
            where = draw(st.sampled_from(["start", "middle", "end"]))
            first = {"start": 0, "middle": (n - length) // 2, "end": n - length}[where]
            bad |= set(range(first, first + length))
        sizes[r], poison[r] = n, bad
    return sizes, poison


def epoch_bound(sizes, poison) -> int:
    """Epochs within which every poison record is dead-lettered, whatever its neighbours: per poison record, its
    isolation (a range halved until it stands alone, each half that passes committed: 2 epochs per halving at
    most) and one epoch in which it fails alone and is dead-lettered; regions go on side by side."""
    return max(len(poison[r]) * (2 * math.ceil(math.log2(sizes[r] + 1)) + 2) for r in sizes) + 2


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bursts(), st.lists(st.tuples(st.floats(0, 40), st.floats(0.05, 30), st.sampled_from([REGIONS, ("b",)])),
                          max_size=2))
def test_dead_letter_on_dead_letters_bursts_in_bounded_epochs(data, spans):
    """Liveness: with deadLetterOn naming the poison's class and the shipped retries (4, a minute apart: never
    waited on), every poison record is dead-lettered once within ``epoch_bound`` epochs of running, in bursts of any
    length and where no neighbour can testify; outages on the way (named by outageOn) only delay it and dead-letter
    nothing healthy; every other record is published once, in order."""
    sizes, poison = data
    run = simulate_named(sizes, poison, spans, epochs=epoch_bound(sizes, poison) + 200)
    assert done(run), f"the bounded query did not end: {run.record.regions if run.record else None}"
    for r in REGIONS:
        assert sorted(run.dead[r]) == sorted(poison[r]) and len(run.dead[r]) == len(set(run.dead[r]))
        assert run.published[r] == sorted(set(range(sizes[r])) - poison[r])
    if not spans:
        assert run.epochs <= epoch_bound(sizes, poison), (run.epochs, epoch_bound(sizes, poison))
        assert run.now < 5 * run.epochs + 1  # seconds of epochs: no retry waited a minute


def test_a_bad_file_at_a_regions_start_is_dead_lettered_in_seconds_with_the_defaults():
    """Issue 55's first situation: 10 malformed lines then 10 good ones in region a; before deadLetterOn they were
    never dead-lettered (no neighbour passed between two failures of the first one). With it: all 10, in about 40
    epochs of seconds, the good lines published once."""
    from regional.protocol.settings import resolve_settings

    s = resolve_settings({}, {"deadLetterPath": "/dead", "deadLetterOn": "ValueError"}, {})
    assert (s.dead_letter_retries, s.dead_letter_retry_backoff_s, s.dead_letter_on) == (4, 60.0, ("ValueError",))
    run = simulate_named({"a": 20}, {"a": set(range(10))}, [], retries=s.dead_letter_retries,
                         backoff=s.dead_letter_retry_backoff_s)
    assert done(run) and run.dead["a"] == list(range(10)) and run.published["a"] == list(range(10, 20))
    assert run.epochs <= epoch_bound({"a": 20}, {"a": set(range(10))}) and run.now < 120
    # Without it, the evidence rule: before issue 55 the first line waited for ever (its neighbours were poison too);
    # now witnesses further along (the good lines) prove each line in turn, with the shipped retries a minute apart.
    proven = simulate_named({"a": 20}, {"a": set(range(10))}, [], dead_letter_on=(), retries=4, backoff=60.0)
    assert done(proven) and proven.dead["a"] == list(range(10)) and proven.published["a"] == list(range(10, 20))
    assert all("dead-lettered by onSuspectTimeout" not in (r.reason or "") for r in proven.record.regions.values())


def test_outage_on_holds_a_record_through_an_outage_the_evidence_rule_would_take_for_poison():
    """Two outages back to back (every region for 30.2 s, then a and b for 16.2 s, found by a search with outageOn
    left out): with deadLetterRetries=0 and no backoff, the evidence rule dead-letters healthy b@0; naming
    ConnectionError in outageOn, nothing is, and the reason says why."""
    flaps = [(0.0, 30.2, REGIONS), (32.9, 16.2, ("a", "b"))]
    sizes, none = {"a": 2, "b": 2, "c": 6, "d": 7}, {r: set() for r in REGIONS}
    fooled = simulate_named(sizes, none, flaps, dead_letter_on=(), outage_on=(), retries=0, backoff=0.0)
    assert fooled.dead["b"] == [0], "the evidence rule alone is fooled by these outages"
    held = NamedRun(Service([(lo, lo + n, frozenset(sc)) for lo, n, sc in flaps]), none, sizes,
                    Settings(dead_letter_path="/dead", region_attempts=ATTEMPTS, max_failure_ratio=1.0,
                             outage_on=("ConnectionError",)),
                    published={r: [] for r in REGIONS}, dead={r: [] for r in REGIONS})
    reasons = []
    for epoch in range(600):
        plan = held.epoch(epoch)
        reasons += [s.reason for s in held.record.regions.values() if s.reason] if held.record else []
        if done(held) or not plan.regions:
            break
    assert done(held) and held.dead == {r: [] for r in REGIONS}
    assert all(held.published[r] == list(range(n)) for r, n in sizes.items())
    assert any("ConnectionError, named by outageOn (ConnectionError): an outage, never dead-lettered" in r
               for r in reasons)
