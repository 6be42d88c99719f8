"""The decision of one epoch (``decide``): its kind, what each region committed, which fell back and the
epoch they still reference, and every region's state after it; straggler ranges (``timed_range``). Pure."""

from __future__ import annotations

from collections.abc import Mapping

from regional.errors import RegionalDeadLetterLimitError
from regional.protocol.decide.evidence import forget_evidence, own_evidence, recent_poison, shrunk_set, weigh_evidence
from regional.protocol.decide.outcomes import DONE, UNKNOWN_CAUSE, Outcome, RegionOutcome
from regional.protocol.plan import EpochPlan, RegionRange
from regional.protocol.settings import Settings
from regional.store.model import (
    DeadLetter,
    EpochKind,
    EpochRecord,
    FallBack,
    RegionState,
    Slice,
    Standing,
)


def forced_global_reason(previous: Mapping[str, RegionState], settings: Settings) -> str | None:
    """Tier 1: a region that fell back ``maxConsecutiveFailures`` epochs in a row forces a global epoch."""
    stuck = sorted(r for r, s in previous.items() if s.consecutive_failures >= settings.max_consecutive_failures)

    if not stuck:
        return None
    return (f"{len(stuck)} region(s) fell back {settings.max_consecutive_failures} epochs in a row "
            f"(maxConsecutiveFailures), e.g. {stuck[0]!r}")


def decide(plan: EpochPlan, outcomes: Mapping[str, RegionOutcome], previous: EpochRecord | None,
           force_reason: str | None = None, now: float = 0.0) -> EpochRecord:
    """Decide epoch ``plan.epoch`` from its regions' outcomes: which regions publish, and every
    region's state after it. A planned region without an outcome falls back. ``now``: the record's time.

    With ``deadLetterPath`` or ``deadLetterTopic``, a quarantined range becomes the region's ``isolating``
    range (even in an aborted epoch: what failed on every attempt is known, publishing or not); a committed
    prefix of it shortens it; a dead-lettered record (an isolated one that failed on every attempt) counts
    as done.

    Poison needs evidence (``weigh_evidence``): an isolated record is dead-lettered only when it failed alone, then
    records of its own region beside it passed, then it failed alone again, in that epoch order. An epoch in which
    every region with work failed is an outage: its quarantines count towards ``maxFailureRatio`` and
    ``maxConsecutiveFailures`` like any failure, and one that made no progress at all makes the next epoch wait
    (``EpochRecord.backoff_s``). Otherwise, while an isolating range narrows, or a suspect gathers evidence, the
    region's quarantines count neither as consecutive failures nor towards ``maxFailureRatio``: isolation is progress,
    and must not hold back the healthy regions."""
    settings = plan.settings
    before = previous.regions if previous else {}
    seen, evidence = weigh_evidence(plan, {rr.region: outcomes.get(rr.region) or RegionOutcome(
        rr.region, Outcome.MISSING, rr.start, reason="no outcome") for rr in plan.regions}, before, now)
    retrying = {r for r, e in evidence.items() if e.progress}
    letters = sorted(r for r, o in seen.items() if o.status is Outcome.DEAD_LETTERED)
    if len(letters) > settings.max_dead_letters_per_epoch:
        raise RegionalDeadLetterLimitError(
            f"epoch {plan.epoch} would dead-letter {len(letters)} records (regions {', '.join(letters[:5])}), more "
            f"than maxDeadLettersPerEpoch={settings.max_dead_letters_per_epoch}; nothing was dead-lettered. So many "
            f"poison records at once usually mean a bug or a broken dependency, not bad input: look at the error "
            f"({seen[letters[0]].reason}), fix it and restart; or raise maxDeadLettersPerEpoch if the records "
            "really are bad")
    failed = {r: o for r, o in seen.items() if o.status not in DONE}
    outage = (bool(plan.regions) and not letters and not retrying
              and not any(o.status is Outcome.WRITTEN for o in seen.values()))
    narrowing = isolation_narrowing(plan, failed, before)
    # Isolation is progress, unless every region with work failed; so is a suspect's failure beside records of its
    # region that passed (evidence gathered, towards a try).
    excused = retrying | (set() if outage else narrowing)
    force_reason = force_reason or plan.force_reason or forced_global_reason(before, settings)
    kind, reason = epoch_kind(plan, failed, excused, force_reason)
    reset_counters = kind is EpochKind.ABORTED and force_reason is not None and settings.enabled

    timeout = settings.region_timeout_s if settings.enabled else None
    slow = straggler_cost(plan, seen) if timeout is not None else None
    committed: dict[str, Slice] = {}
    fallen_back: dict[str, FallBack] = {}
    dead_lettered: dict[str, DeadLetter] = {}
    regions = dict(before)  # regions without work keep their state
    for rr in plan.regions:
        # A region's range starts at its committed offset, or where it first starts, or past lost records.
        state, outcome = before.get(rr.region), seen[rr.region]
        if state is None:  # first seen now: its ref_epoch -1 is as old as this
            state = RegionState(committed_offset=rr.start, first_seen_epoch=plan.epoch, first_seen_at=now)
        if kind is EpochKind.ABORTED or rr.region in failed:
            regions[rr.region], fallen_back[rr.region] = fell_back(
                rr, state, failed.get(rr.region), rr.region in narrowing, rr.region in excused, reason,
                reset_counters, timeout)
            if rr.region in evidence:  # kept even if the epoch aborts: what was seen of the record was seen
                regions[rr.region] = evidence[rr.region].applied(regions[rr.region])
            elif outcome.status is Outcome.DEAD_LETTERED:  # aborted: its set still loses the members that passed
                kept = regions[rr.region]
                regions[rr.region] = kept._replace(together_to=shrunk_set(rr.start, kept, outcome.members))
        elif outcome.status is Outcome.DEAD_LETTERED:
            end = rr.start + outcome.together  # a set proven together (suspectsTogether) goes as one
            dead_lettered[rr.region] = DeadLetter(rr.start, outcome.reason or UNKNOWN_CAUSE, outcome.together,
                                                  outcome.note if outcome.together > 1 else None)
            # RegionState(...) rather than ._replace: this runs once per region with work, and a copy with
            # changes costs several times more (10,000 regions: tens of ms of the driver's epoch).
            burst = failed_beyond(end, outcome)
            regions[rr.region] = RegionState(end, plan.epoch, isolating=burst,
                                             dead_letters=state.dead_letters + outcome.together,
                                             timed_range=state.timed_range if timeout else None,
                                             poison=recent_poison((*state.poison, *range(rr.start, end)), end),
                                             # the clock goes on only into the burst that failed beside it now, and
                                             # only when no witness ever passed beside it (a region of nothing but
                                             # poison): a record that fails later (a short outage, hours on), or one
                                             # beside a witness (a short outage now), gets its own bound
                                             suspect_since_at=None if burst is None or witnessed(state, rr, outcome)
                                             else outcome.timed_out_since)
        else:
            committed[rr.region] = Slice(rr.start, outcome.end, outcome.rows, cut=outcome.end < rr.end)
            regions[rr.region] = wrote(plan.epoch, rr, state, outcome, timeout, slow)
            if outcome.members:  # its suspect passed alone: the members that failed alone are what to isolate
                regions[rr.region] = regions[rr.region]._replace(isolating=failed_beyond(outcome.end, outcome))
    planned = {rr.region for rr in plan.regions}
    for region, (_gone_from, go_on) in plan.lost.items():  # lost records are gone, work or not
        if region not in planned:
            regions[region] = forget_evidence(regions.get(region, RegionState())._replace(committed_offset=go_on))
    regional = (previous.regional_epochs if previous else 0) + (kind is EpochKind.REGIONAL)
    stalled = outage and not narrowing  # nothing committed, dead-lettered or narrowed: the next epoch waits
    outages = (previous.outage_epochs if previous else 0) + 1 if stalled else 0
    return EpochRecord(plan.epoch, kind, committed, fallen_back, regions, reason, regional, now, dict(plan.lost),
                       dead_lettered, outages, settings.dead_letter_retries, settings.dead_letter_retry_backoff_s,
                       settings.suspect_timeout_s if settings.isolates else None, settings.dead_letter_on_timeout)


# Poison or outage (docs/design.md, "Poison or outage"). A record that failed alone on every attempt is a *suspect*.

def isolation_narrowing(plan: EpochPlan, failed: Mapping[str, RegionOutcome],
                        before: Mapping[str, RegionState]) -> set[str]:
    """With ``deadLetterPath``: the quarantined regions whose quarantine narrows their isolating range."""
    settings = plan.settings
    if not (settings.enabled and settings.isolates):
        return set()
    return {rr.region for rr in plan.regions if rr.region in failed
            and failed[rr.region].status is Outcome.QUARANTINED and narrows(before.get(rr.region), rr)}


def epoch_kind(plan: EpochPlan, failed: Mapping[str, RegionOutcome], narrowing: set[str],
               force_reason: str | None) -> tuple[EpochKind, str | None]:
    """The epoch's kind and why, from which regions failed (tier 1 and 2 of ``maxConsecutiveFailures``,
    ``maxFailureRatio``, ``enabled``)."""
    settings = plan.settings
    if not failed:
        return (EpochKind.FORCED_GLOBAL, force_reason) if force_reason else (EpochKind.GLOBAL, None)
    if not settings.enabled:
        return EpochKind.ABORTED, "regional epochs are disabled (spark.regional.enabled=false)"
    if force_reason:
        # Tier 2: the forced-global epoch failed. Publish nothing, reset counters, go on.
        return EpochKind.ABORTED, f"forced global epoch failed: {force_reason}"
    counted = len(failed) - len(narrowing)
    if counted > settings.max_failure_ratio * len(plan.regions):
        return EpochKind.ABORTED, (
            f"{counted} of {len(plan.regions)} regions with work failed, more than "
            f"maxFailureRatio={settings.max_failure_ratio}"
            + (f" ({len(narrowing)} more are isolating poison records)" if narrowing else ""))
    return EpochKind.REGIONAL, None


def witnessed(state: RegionState, rr: RegionRange, outcome: RegionOutcome) -> bool:
    """Whether records of its region beside the suspect ``rr`` ever passed and wrote rows (now, or since it first
    failed alone): a region with a witness can prove the records after it, each within its own bound."""
    return outcome.neighbours_passed or own_evidence(state, rr).probe_passed is not None


def failed_beyond(end: int, outcome: RegionOutcome) -> tuple[int, int] | None:
    """Where its region isolates next once ``[.., end)`` is done: the members past ``end`` that failed alone now
    (from the first to the last: a set forms there), or the range after its suspect whose probe failed now (poison
    comes in bursts); else None, and the region reads as usual."""
    failing = [m.offset for m in outcome.members if m.offset >= end and m.status is Outcome.DEAD_LETTERED]
    if failing:
        return failing[0], failing[-1] + 1
    if outcome.members and outcome.members[-1].offset < end:  # every record tried went: the burst may go on
        return end, end + 1
    if outcome.failed_after_to is not None and outcome.failed_after_to > end:
        return end, outcome.failed_after_to
    return None


def wrote(epoch: int, rr: RegionRange, state: RegionState, outcome: RegionOutcome, timeout: float | None,
          slow: float | None) -> RegionState:
    """A region's state after it committed ``[rr.start, outcome.end)`` in ``epoch``."""
    span = outcome.end - rr.start
    return RegionState(
        outcome.end, epoch, isolating=rest_of_isolation(state.isolating, outcome.end),
        dead_letters=state.dead_letters,
        timed_range=None if timeout is None else timed_range(
            timeout, state.timed_range, span, outcome.seconds,
            slow is not None and outcome.seconds is not None and outcome.seconds > slow * span),
        poison=recent_poison(state.poison, outcome.end) if state.poison else ())


def fell_back(rr: RegionRange, state: RegionState, own: RegionOutcome | None, narrowed: bool, excused: bool,
              epoch_reason: str | None, reset_counters: bool, timeout: float | None) -> tuple[RegionState, FallBack]:
    """A region's state after it fell back: its own failure (``own``), or an aborted epoch (``own`` None).
    ``narrowed``: its whole planned range failed on every attempt, so the poison is in it (or an outage hit it);
    ``excused``: that narrowing is isolation's progress, not counted as a failure."""
    why = own.reason if own and own.reason else f"epoch aborted: {epoch_reason}"
    quarantined = own is not None and own.status is Outcome.QUARANTINED
    counted = own is not None and not excused
    same_start = rr.start == state.committed_offset  # else records before its range were lost: it moved on
    # A record's evidence stays its own: a region that moved on starts afresh.
    kept = state if same_start else forget_evidence(state)
    after = RegionState(
        rr.start, state.last_epoch, 0 if reset_counters else state.consecutive_failures + counted,
        Standing.QUARANTINED if quarantined else Standing.FALLEN_BACK, why,
        (rr.start, rr.end) if narrowed else state.isolating, state.dead_letters,
        state.timed_range if timeout else None, kept.failed_alone, kept.failed_alone_at, kept.alone_since,
        kept.probe_passed, kept.alone_waits, recent_poison(state.poison, rr.start) if state.poison else (),
        state.first_seen_epoch, state.first_seen_at, kept.suspect_since_at, kept.together_to)
    ref = after.ref_epoch
    return after, FallBack(-1 if ref is None else ref, why, quarantined)


# regionTimeout (FLIP-76: a slow part must not hold the epoch hostage). The source's cut cannot save what is
# already between it and the sink when the clock runs out (Spark moves it through the UDF anyway: all of a
# small range), so a straggler's next ranges are sized to what it did within the timeout instead.
STRAGGLER_COST = 2.0  # a region is a straggler when an offset costs it this many times the epoch's median
MIN_TIMED_RANGE = 100  # the smallest range a straggler is given (the source's timed read batch)


def straggler_cost(plan: EpochPlan, seen: Mapping[str, RegionOutcome]) -> float | None:
    """Seconds per offset above which a written region counts as a straggler in this epoch: ``STRAGGLER_COST``
    times the median over the epoch's written regions. Relative, so that slowness every region shares (a
    loaded machine, a timeout below the tasks' own overhead) sizes no one down."""
    costs = sorted(o.seconds / (o.end - rr.start) for rr in plan.regions
                   if (o := seen[rr.region]).status is Outcome.WRITTEN and o.seconds is not None and o.end > rr.start)
    return STRAGGLER_COST * costs[len(costs) // 2] if costs else None


def timed_range(timeout: float, cap: int | None, span: int, seconds: float | None, straggler: bool) -> int | None:
    """The most offsets a region's next range may hold, from its slice of ``span`` offsets that took ``seconds``
    (``cap``: its limit so far; None: no limit of its own).

    - Over time: a straggler (or a region already limited) gets what it did per ``timeout``, at least
      ``MIN_TIMED_RANGE``.
    - In time with its whole limit used: the limit grows, at most twice.
    - In time with less than its limit: no limit; a later overrun sizes it again.
    - Unmeasured: unchanged."""
    if seconds is None or span <= 0:
        return cap
    if seconds > timeout:
        if cap is None and not straggler:
            return None
        return max(MIN_TIMED_RANGE, int(span * timeout / seconds))
    if cap is not None and span >= cap:
        return max(MIN_TIMED_RANGE, int(cap * min(2.0, timeout / max(seconds, 1e-3))))
    return None


def narrows(state: RegionState | None, rr: RegionRange) -> bool:
    """Whether a quarantine of ``rr`` narrows its region's isolating range (or starts one). A range the
    region has moved past (records lost to retention) is no longer being isolated."""
    suspect = state.isolating if state else None
    return suspect is None or rr.start >= suspect[1] or rr.end - rr.start < suspect[1] - suspect[0]


def rest_of_isolation(suspect: tuple[int, int] | None, committed_to: int) -> tuple[int, int] | None:
    """What is left to isolate once offsets up to ``committed_to`` are committed: the poison is past them."""
    if suspect is None or committed_to >= suspect[1]:
        return None
    return max(suspect[0], committed_to), suspect[1]
