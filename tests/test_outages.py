"""Outages are not poison (deadLetterPath): random stretches of epochs in which every task of every region fails
(a service the query calls is down), interleaved with real poison records. Pure: plan and decide, no Spark."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from regional.protocol.decide import decide, outcomes_from_tasks
from regional.protocol.plan import PROBE_SPAN, plan_epoch
from regional.store import EpochKind
from test_dead_letters import run_attempts, with_dead_letters

REGIONS = ("h1", "h2", "p")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 120), poison=st.sets(st.integers(0, 119), max_size=3),
       outages=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), max_size=3),
       grow=st.integers(0, 3))
def test_no_healthy_record_is_dead_lettered_through_outages(n, poison, outages, grow):
    """Every region fails on every attempt in the outage epochs. Whatever the stretches: no healthy record is
    dead-lettered, every poison record is, every other record is published exactly once, in offset order; outage
    epochs count as failures (they abort, and back off when nothing progresses). A poison record needs a healthy
    record of its region near it (its probes), or nothing can tell it from an outage."""
    poison = {o for o in poison if o < n}
    assume(all(any(o not in poison for o in range(max(0, p - PROBE_SPAN), min(n, p + PROBE_SPAN + 1)))
               for p in poison))
    down = {e for start, length in outages for e in range(start, start + length)}
    s = with_dead_letters()
    available = {"h1": 5, "h2": 3, "p": n}
    record, published, dead = None, {r: [] for r in REGIONS}, []
    bound = max(down, default=0) + 1 + (len(poison) + 1) * (math.ceil(math.log2(n + 1)) + 6) * 2
    for epoch in range(bound):
        if record is not None and record.regions["p"].committed_offset == n and epoch > max(down, default=-1):
            break
        available["h1"] += grow
        available["h2"] += 1
        plan = plan_epoch(epoch, "q", "ck", record.regions if record else {}, available, s)
        if epoch in down:
            fails = {r: dict.fromkeys(range(available[r] + 1), math.inf) for r in REGIONS}  # probes too
        else:
            fails = {"p": dict.fromkeys(poison, math.inf)}
        record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, fails)), record)
        for region, sl in record.committed.items():
            published[region] += list(range(sl.start, sl.end))
        for region, letter in record.dead_lettered.items():
            assert region == "p" and letter.offset in poison, f"healthy {region}@{letter.offset} dead-lettered"
            dead.append(letter.offset)
        if epoch in down and plan.regions and not record.dead_lettered:  # (poison proven before, failing again)
            assert not record.committed and record.kind is EpochKind.ABORTED  # an outage counts, and aborts
    else:
        raise AssertionError(f"not done within {bound} epochs")
    assert set(dead) == poison and sorted(dead) == dead  # every poison record once, no healthy one
    assert published["p"] == sorted(set(range(n)) - poison)
    for region in ("h1", "h2"):
        assert published[region] == list(range(len(published[region])))


def test_an_outage_backs_off_and_counts_towards_consecutive_failures():
    """Three regions down for good, no deadLetterPath needed: epochs abort, failures count, forced-global epochs
    come, and the wait between epochs doubles up to its cap."""
    s = with_dead_letters(max_consecutive_failures=3)
    record, waits, reasons = None, [], []
    for epoch in range(12):
        plan = plan_epoch(epoch, "q", "ck", record.regions if record else {}, dict.fromkeys(REGIONS, 10), s)
        fails = {r: dict.fromkeys(range(11), math.inf) for r in REGIONS}
        record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, fails)), record)
        waits.append(record.backoff_s)
        reasons.append(record.reason or "")
        assert record.kind is EpochKind.ABORTED and not record.dead_lettered
    assert any("forced global epoch failed" in r for r in reasons)  # the failures counted: tier 1, then 2
    assert waits[-1] == 10.0 and waits == sorted(waits) and waits[-1] > waits[len(waits) // 2]
