"""Poison or outage: the evidence an epoch adds about a region's suspect record, the sets proven together
(``suspectsTogether``), and the bound on a suspect (docs/design.md, "Poison or outage"). Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import NamedTuple

from regional.errors import RegionalSuspectTimeoutError
from regional.protocol.decide.outcomes import UNKNOWN_CAUSE, Member, Outcome, RegionOutcome
from regional.protocol.decide.verdicts import Verdict
from regional.protocol.plan import PROBE_REACH, EpochPlan, RegionRange
from regional.protocol.settings import Settings
from regional.store.model import (
    RegionState,
    suspect_backoff,
)

# It is poison only on a sandwich, in the driver's epoch order (epochs run one after another): it failed alone in an
# epoch a, records of its own region beside it (its probes) wrote rows in an epoch b > a, and it failed alone again
# in an epoch c > b. Such a failure in c is a *try*. One outage, of any scope, starting and ending at any moment,
# cannot make one: it would have to hold a and c, hence b. Other regions passing is no evidence (a service behind
# some regions only may be down). With deadLetterRetries, a record is dead-lettered on its try number
# deadLetterRetries + 1, each try deadLetterRetryBackoff after the one before (``plan.retry_due``): a flapping service
# must fool the rule again and again, over minutes.
NO_NEIGHBOUR = ("failed alone on every attempt, and it has no neighbour in its region to try (records of its region "
                "beside it, not dead-lettered): it is tried again, never dead-lettered on that alone")
NEIGHBOURS_FAILED = ("failed alone on every attempt, and records of its region beside it failed too (an outage of "
                     "what the region calls?): it is tried again, never dead-lettered on that")
NO_SANDWICH = ("failed alone on every attempt; records of its region beside it passed, but not yet between two of "
               "its failures: it is tried again to tell poison from an outage that ended")


# What a suspect lacked at its bound, by why it was waiting.
MISSING = {
    NO_NEIGHBOUR: "its region has no other record to try as a witness",
    NEIGHBOURS_FAILED: ("no witness passed and wrote rows: the records of its region tried beside it (before it, after "
                        "it, at the end of what the region has) failed too, or were filtered out"),
    NO_SANDWICH: "witnesses passed, but not between two of its failures alone yet",
}


class Evidence(NamedTuple):
    """What an epoch saw of a region's suspect record, to be kept in its ``RegionState``."""

    failed_alone: int  # tries so far
    failed_alone_at: float | None
    alone_since: int | None
    probe_passed: int | None
    alone_waits: int
    progress: bool  # a try, or records beside it passed now: isolation's progress, not a failure of the region
    since_at: float | None = None  # when it first failed alone: suspectTimeout runs from here (None: no bound runs)
    together_to: int | None = None  # the end of the set weighed with it (``RegionState.together_to``)

    def applied(self, state: RegionState) -> RegionState:
        return state._replace(failed_alone=self.failed_alone, failed_alone_at=self.failed_alone_at,
                              alone_since=self.alone_since, probe_passed=self.probe_passed,
                              alone_waits=self.alone_waits, suspect_since_at=self.since_at,
                              together_to=self.together_to)


def own_evidence(state: RegionState | None, rr: RegionRange) -> RegionState:
    """``state`` if its evidence is about the record ``rr`` isolates, else a state without evidence (the region
    moved on since: records lost to retention)."""
    if state is None:
        return RegionState(rr.start)
    return state if state.committed_offset == rr.start else forget_evidence(state)


def forget_evidence(state: RegionState) -> RegionState:
    if not (state.failed_alone or state.failed_alone_at is not None or state.alone_since is not None
            or state.probe_passed is not None or state.alone_waits or state.suspect_since_at is not None
            or state.together_to is not None):
        return state
    return state._replace(failed_alone=0, failed_alone_at=None, alone_since=None, probe_passed=None, alone_waits=0,
                          suspect_since_at=None, together_to=None)


def weigh_evidence(plan: EpochPlan, seen: dict[str, RegionOutcome], before: Mapping[str, RegionState],
                   now: float) -> tuple[dict[str, RegionOutcome], dict[str, Evidence]]:
    """``seen``, with each dead letter that is no last try turned back into a quarantine, and what the epoch saw of
    each isolated record that did not pass (to keep in its state)."""
    isolated = [rr for rr in plan.regions if rr.isolated and seen[rr.region].status is not Outcome.WRITTEN]
    if not isolated:
        return seen, {}
    probed = {rr.region for rr in plan.probes}
    retries, backoff = plan.settings.dead_letter_retries, plan.settings.dead_letter_retry_backoff_s
    checked, evidence = dict(seen), {}
    for rr in isolated:
        outcome, state = seen[rr.region], own_evidence(before.get(rr.region), rr)
        passed_now = outcome.neighbours_passed
        passed = plan.epoch if passed_now else state.probe_passed
        if outcome.status is not Outcome.DEAD_LETTERED:  # no account of the record (its sink failed, or missing)
            # Its members that did not fail alone now leave its set all the same: one that passes once is no poison.
            evidence[rr.region] = Evidence(state.failed_alone, state.failed_alone_at, state.alone_since, passed,
                                           state.alone_waits, False, state.suspect_since_at,
                                           shrunk_set(rr.start, state, outcome.members))
            continue
        cause = outcome.reason or UNKNOWN_CAUSE
        together_to = set_end(rr.start, state, outcome.members)
        if outcome.verdict is not None and outcome.verdict.poison:
            if not outcome.verdict.by_target or passed_now:
                # The record's fault by its exception's class: dead-lettered on this first failure alone, with the
                # members after it that failed alone by a class that says so too.
                count = 1 + failing_prefix(rr.start, outcome.members, poison_verdict(passed_now))
                checked[rr.region] = outcome._replace(together=count)
                continue
            # The target refused it, but nothing beside it passed the target now: every row may be refused alike (a
            # column the query leaves out, a rule changed by DDL). The evidence rule decides, so nothing drains.
            cause += ("; the target's verdict needs records of its region beside it to pass the target in the same "
                      "epoch, and none did: the evidence rule decides")
        if together_to is not None and together_to > rr.start + 1:
            cause += (f"; weighed with {offsets(rr.start + 1, together_to)}, which failed alone beside it in every "
                      "epoch it did (suspectsTogether): they go to the dead letters with it, or not at all")
        if outcome.verdict is not None and not outcome.verdict.poison:  # an outage by its class: never dead-lettered
            waits = state.alone_waits + 1
            # As a failure alone that is no try: records beside it passing now is the region's progress.
            evidence[rr.region] = Evidence(state.failed_alone, now, None, passed, waits, passed_now, None, together_to)
            checked[rr.region] = outcome._replace(status=Outcome.QUARANTINED, dead_letter=None, reason=(
                f"offset {rr.start} failed alone on every attempt with {outcome.verdict.why}: an outage, never "
                f"dead-lettered; tried again after {utc(now + suspect_backoff(waits))} ({cause})"))
            continue
        if cause == UNKNOWN_CAUSE and (plan.settings.dead_letter_on or plan.settings.outage_on):
            cause += "; deadLetterOn and outageOn cannot apply without it, the evidence rule decides"
        since, before_now = state.alone_since, state.probe_passed
        sandwich = since is not None and before_now is not None and since < before_now < plan.epoch
        since_at = now if state.suspect_since_at is None else state.suspect_since_at
        bound = plan.settings.suspect_timeout_s
        timed_out = bound is not None and now >= since_at + bound
        if sandwich:
            tries = state.failed_alone + 1
            if tries > retries:  # its last try: dead-lettered, with the set that failed alone beside it each time
                checked[rr.region] = outcome._replace(together=(together_to or rr.start + 1) - rr.start)
                continue
            if not timed_out:
                evidence[rr.region] = Evidence(tries, now, plan.epoch, passed, 0, True, since_at, together_to)
                checked[rr.region] = outcome._replace(status=Outcome.QUARANTINED, dead_letter=None, reason=(
                    f"offset {rr.start} failed alone {tries} of {retries + 1} times, each after records of its "
                    f"region beside it passed (deadLetterRetries={retries}); retried after {utc(now + backoff)} "
                    f"({cause})"))
                continue
        waits = state.alone_waits + 1
        why = NO_SANDWICH if passed is not None else NEIGHBOURS_FAILED if rr.region in probed else NO_NEIGHBOUR
        if timed_out and bound is not None:
            tried = state.failed_alone + sandwich
            lacked = (f"it failed alone {tried} of the {retries + 1} tries deadLetterRetries asks for (each after a "
                      "witness passed)" if tried else MISSING[why])
            unproven = (f"offset {rr.start} was not proven poison within suspectTimeout={bound:g}s of its first "
                        f"failure alone at {utc(since_at)}: {lacked}")
            if plan.settings.dead_letter_on_timeout and not outcome.published_failed:
                count = (together_to or rr.start + 1) - rr.start
                policy = f"dead-lettered by onSuspectTimeout=deadLetter: {unproven}"
                # its set goes unproven too, and each of its dead letters says so (``DeadLetter.note``)
                checked[rr.region] = outcome._replace(timed_out_since=since_at, together=count,
                                                      reason=f"{cause}; {policy}", note=policy)
                continue
            evidence[rr.region] = Evidence(state.failed_alone, now, plan.epoch if since is None else since, passed,
                                           waits, False, since_at, together_to)
            then = ("records its region already published fail now too (an outage, or a changed query): "
                    "onSuspectTimeout=deadLetter never dead-letters on that; tried again after "
                    f"{utc(now + suspect_backoff(waits))}" if plan.settings.dead_letter_on_timeout
                    else "the query stops at its next plan (onSuspectTimeout=fail)")
            checked[rr.region] = outcome._replace(status=Outcome.QUARANTINED, dead_letter=None, reason=(
                f"{unproven}; {then} ({cause})"))
            continue
        evidence[rr.region] = Evidence(state.failed_alone, now, plan.epoch if since is None else since, passed,
                                       waits, passed_now, since_at, together_to)
        looks = "" if why is NO_SANDWICH else "; looks like an outage, not poison, so far"
        checked[rr.region] = outcome._replace(status=Outcome.QUARANTINED, dead_letter=None, reason=(
            f"offset {rr.start} {why}{looks}; tried again after {utc(now + suspect_backoff(waits))} ({cause})"))
    return checked, evidence


def offsets(start: int, end: int) -> str:
    """``[start, end)`` for a reason: ``offset 4`` or ``offsets 4 to 9``."""
    return f"offset {start}" if end == start + 1 else f"offsets {start} to {end - 1}"


def set_end(suspect: int, state: RegionState, members: Sequence[Member]) -> int | None:
    """The end of the set weighed with the suspect at ``suspect`` after this epoch, in which it failed alone: its
    members that failed alone now (none by a class that means an outage), in a row from the record after it, and
    only those that did so in every earlier epoch it failed alone (``state.together_to``). A set forms at the
    suspect's first failure alone only; afterwards it can only shrink, so each record in it failed alone in every
    epoch its suspect did, beside the same witnesses: one proof serves them all. None: no set (none tried)."""
    if not members and state.together_to is None:
        return None
    now = suspect + 1 + failing_prefix(suspect, members, lambda v: v is None or v.poison)
    if state.together_to is not None:
        return min(state.together_to, now)
    return now if state.failed_alone_at is None else suspect + 1


def shrunk_set(suspect: int, state: RegionState, members: Sequence[Member]) -> int | None:
    """The end of the set weighed with the suspect at ``suspect`` after an epoch that weighs nothing of it (its own
    account missing, or the epoch aborted): the members that did not fail alone now leave it (``set_end``'s rule),
    but no set forms. None: none formed."""
    return None if state.together_to is None else set_end(suspect, state, members)


def poison_verdict(witnessed: bool) -> Callable[[Verdict | None], bool]:
    """Whether a verdict dead-letters a record at once: the record's fault by its class (a target's verdict only
    while records beside it passed the target in the same epoch, ``witnessed``)."""
    return lambda v: v is not None and v.poison and (not v.by_target or witnessed)


def failing_prefix(suspect: int, members: Sequence[Member], accepts: Callable[[Verdict | None], bool]) -> int:
    """How many members, in a row from the record after ``suspect``, failed alone with a verdict ``accepts``."""
    count = 0
    for m in members:
        if m.offset != suspect + 1 + count or m.status is not Outcome.DEAD_LETTERED or not m.dead_letter \
                or not accepts(m.verdict):
            break
        count += 1
    return count


UNPROVEN_ADVICE = ("if it is bad input, name its exception class in deadLetterOn, or set onSuspectTimeout=deadLetter; "
                   "if it is an outage, name its class in outageOn, or raise suspectTimeout; then start the query "
                   "again: it goes on where it stopped, and tries the record once more")


def unproven_suspects(states: Mapping[str, RegionState], settings: Settings, run_started_at: float) -> None:
    """Refuse to plan on (``RegionalSuspectTimeoutError``) when a region's suspect failed alone, in this run, at or
    after its ``suspectTimeout``, unproven, and that fails the query (``onSuspectTimeout=fail``). Judged with this
    run's settings, and only on failures seen in this run: a start with ``deadLetterOn``, ``outageOn``, a longer
    ``suspectTimeout`` or ``deadLetter`` tries the record once more under them."""
    bound = settings.suspect_timeout_s
    if bound is None or settings.dead_letter_on_timeout or not settings.isolates:
        return
    stuck = sorted((r, s) for r, s in states.items()
                   if s.suspect_since_at is not None and s.failed_alone_at is not None and s.ref_epoch is not None
                   and s.failed_alone_at >= max(s.suspect_since_at + bound, run_started_at))
    if not stuck:
        return
    region, state = stuck[0]
    more = f" (and {len(stuck) - 1} more region(s))" if len(stuck) > 1 else ""
    raise RegionalSuspectTimeoutError(
        f"region {region!r}{more}: the record at offset {state.committed_offset} kept failing alone and was neither "
        f"proven poison nor passed within suspectTimeout={bound:g}s (onSuspectTimeout=fail). Its last reason: "
        f"{state.reason}. What to do: {UNPROVEN_ADVICE}")


def utc(seconds: float) -> str:
    """A wall-clock time for a reason: ``2026-11-25 21:40:03 UTC``."""
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def recent_poison(offsets: tuple[int, ...], committed: int) -> tuple[int, ...]:
    """The dead-lettered offsets a later probe may meet: all of those at most ``PROBE_REACH`` below ``committed``
    (probes reach no further, ``probe_ranges``; at most ``PROBE_REACH`` of them)."""
    return tuple(o for o in offsets if o >= committed - PROBE_REACH)

