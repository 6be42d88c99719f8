"""What a sink task reports, matched to the plan and checked (anything that does not add up is
``Outcome.MISSING``: the region falls back), and why an isolated record's attempts failed (the shim's failure
records). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

from regional.errors import RegionalPlanError
from regional.protocol.decide.verdicts import Verdict, verdict_of
from regional.protocol.plan import EpochPlan, RegionRange
from regional.protocol.settings import Settings
from regional.store.model import (
    TaskFailure,
)

# -- What a task reports ----------------------------------------------------------------------


class Outcome(str, Enum):
    """What happened to one region in one epoch: the one account a task gives and the decision reads."""

    WRITTEN = "written"  # staged what the source read: [start, end), a prefix of the range when cut
    FAILED = "failed"  # the sink's own work (the target's prepare) failed
    QUARANTINED = "quarantined"  # the attempt numbered regionAttempts: upstream failed before; read nothing
    MISSING = "missing"  # no trustworthy account of what was read (no receipt, a task that reported nothing)
    DEAD_LETTERED = "dead_lettered"  # an isolated record failed on every attempt: it goes to the dead letters


DONE = (Outcome.WRITTEN, Outcome.DEAD_LETTERED)  # outcomes after which a region's range counts as done
UPSTREAM = (Outcome.QUARANTINED, Outcome.DEAD_LETTERED)  # outcomes of attempts that failed before the sink


@dataclass(frozen=True)
class TaskOutcome:
    """The commit message of one sink task: explicit about what was read, written and staged."""

    partition: int
    attempt: int
    status: Outcome
    query_id: str | None = None  # from the source's read receipt
    region: str | None = None
    start: int | None = None  # the offsets the source actually read: [start, end)
    end: int | None = None
    rows: int = 0  # rows the target received
    first_offset: int | None = None  # offsets of the first and last row the target received
    last_offset: int | None = None
    handle: Any = None  # the target's staged handle (JSON)
    reason: str | None = None
    region_rows: dict[str, int] | None = None  # an all-or-nothing task holding many regions: rows per region
    dead_letter: bytes | None = None  # quarantined isolated range: its records as the source read them (Arrow IPC)
    seconds: float | None = None  # WRITTEN: from the source's first read to the end of the sink's writing
    plan_error: str | None = None  # the rows broke the sink's contract (reordered, regions mixed): the query fails


class RegionOutcome(NamedTuple):
    """A planned region's outcome, checked against its plan."""

    region: str
    status: Outcome
    end: int  # exclusive end of what is done, for WRITTEN
    rows: int = 0
    reason: str | None = None
    dead_letter: bytes | None = None  # DEAD_LETTERED: the record, as the source read it (Arrow IPC)
    seconds: float | None = None  # WRITTEN: how long its slice took, from the source's first read to the target
    neighbours_passed: bool = False  # a probe (records beside its isolated record) wrote rows in this epoch
    published_failed: bool = False  # a probe of records it already published (before its suspect) failed now
    # A probe from the record right after its suspect, to here, failed now: poison comes in bursts, so once the suspect
    # is dead-lettered its region isolates that range next instead of bisecting all it has from the start.
    failed_after_to: int | None = None
    verdict: Verdict | None = None  # DEAD_LETTERED: what its failures' exception classes say (``verdict_of``)
    # DEAD_LETTERED by onSuspectTimeout=deadLetter, unproven: when its region's suspect first failed alone (kept: the
    # next record of a burst without witness is not given a whole new bound)
    timed_out_since: float | None = None
    members: tuple[Member, ...] = ()  # the records tried alone beside its isolated record (suspectsTogether)
    together: int = 1  # DEAD_LETTERED: records [start, start + together) go to the dead letters, proven as one set
    note: str | None = None  # DEAD_LETTERED: why its set went, added to each member's own error (``DeadLetter.note``)


class Member(NamedTuple):
    """One record tried alone beside a region's suspect (``suspectsTogether``), as its task reported it."""

    offset: int
    status: Outcome  # DEAD_LETTERED: it failed alone on every attempt, and its quarantined attempt read it
    dead_letter: bytes | None = None
    reason: str | None = None
    verdict: Verdict | None = None


def outcomes_from_tasks(plan: EpochPlan, tasks: Sequence[TaskOutcome | None]) -> dict[str, RegionOutcome]:
    """Match task outcomes to planned regions (partition i reads ``plan.regions[i]``) and check them.
    Anything that does not add up makes the region fall back (MISSING); rows of the wrong region fail."""
    if not plan.regions and all(t is None or not t.rows for t in tasks):
        return {}  # an empty epoch (a new query's batch 0 with nothing to read): Spark runs one empty task
    ranges = plan.ranges
    if len(tasks) != len(ranges):
        raise RegionalPlanError(
            f"epoch {plan.epoch}: the sink ran {len(tasks)} tasks for {len(plan.regions)} planned regions"
            + (f" and {len(plan.probes)} probes" if plan.probes else "") + ". "
            "A repartition, coalesce or other shuffle between the regional source and sink mixes regions; "
            "remove it, or set spark.regional.enabled=false"
        )
    outcomes = {}
    for i, (rr, task) in enumerate(zip(plan.regions, tasks, strict=False)):
        outcomes[rr.region] = _checked(plan, i, rr, task)
    suspects = {rr.region: rr.start for rr in plan.regions if rr.isolated} if plan.probes else {}
    members: dict[str, list[Member]] = {}
    for i, rr in enumerate(plan.probes, start=len(plan.regions)):  # evidence for its region's isolated record
        probe = _checked(plan, i, rr, tasks[i])
        if rr.isolated:
            members.setdefault(rr.region, []).append(Member(rr.start, probe.status, probe.dead_letter, probe.reason))
        if probe.status is Outcome.WRITTEN and probe.rows > 0:
            outcomes[rr.region] = outcomes[rr.region]._replace(neighbours_passed=True)
        elif probe.status in (Outcome.QUARANTINED, Outcome.FAILED) and rr.end <= suspects[rr.region]:
            outcomes[rr.region] = outcomes[rr.region]._replace(published_failed=True)
        elif probe.status is Outcome.QUARANTINED and rr.start == suspects[rr.region] + 1:
            outcomes[rr.region] = outcomes[rr.region]._replace(failed_after_to=rr.end)
    for region, tried in members.items():
        outcomes[region] = outcomes[region]._replace(members=tuple(sorted(tried)))
    return outcomes


def upstream_partitions(plan: EpochPlan, outcomes: Mapping[str, RegionOutcome]) -> list[int]:
    """The Spark partitions whose attempts failed upstream of the sink: quarantined regions, and the members
    (``suspectsTogether``) that failed alone. Their failure records say why (``with_failure_causes``)."""
    found = [i for i, rr in enumerate(plan.regions) if outcomes[rr.region].status in UPSTREAM]
    failed = {(region, m.offset) for region, o in outcomes.items() for m in o.members
              if m.status is Outcome.DEAD_LETTERED}
    return found + [i for i, rr in enumerate(plan.probes, start=len(plan.regions))
                    if rr.isolated and (rr.region, rr.start) in failed]


def _checked(plan: EpochPlan, i: int, rr: RegionRange, task: TaskOutcome | None) -> RegionOutcome:
    def missing(why: str) -> RegionOutcome:
        return RegionOutcome(rr.region, Outcome.MISSING, rr.start, reason=why)

    if task is None:
        return missing("its task reported nothing")
    if task.plan_error is not None:
        raise RegionalPlanError(f"epoch {plan.epoch}: {task.plan_error}")
    if task.partition != i:
        return missing(f"partition {i} reported as partition {task.partition}")
    if task.rows and task.region != rr.region:
        raise RegionalPlanError(
            f"epoch {plan.epoch}: sink task {i} received rows of region {task.region!r} but the source planned "
            f"{rr.region!r} there. An operator between source and sink moved rows between tasks (a shuffle); "
            "remove it, or set spark.regional.enabled=false"
        )
    if task.status is Outcome.QUARANTINED and rr.isolated:
        if task.query_id != plan.query_id or task.region != rr.region or task.start != rr.start:
            return missing(f"its quarantine receipt ({task.query_id}, {task.region!r}, {task.start}) does not match "
                           f"the plan ({plan.query_id}, {rr.region!r}, {rr.start})")
        if not task.dead_letter:
            return missing("its isolated record failed on every attempt, but the quarantined attempt could not read "
                           "it to dead-letter it")
        return RegionOutcome(rr.region, Outcome.DEAD_LETTERED, rr.end, reason=task.reason,
                             dead_letter=task.dead_letter)
    if task.status is not Outcome.WRITTEN:
        return RegionOutcome(rr.region, task.status, rr.start, reason=task.reason or task.status.value)
    if task.query_id != plan.query_id or task.region != rr.region or task.start != rr.start or task.end is None:
        return missing(f"its read receipt ({task.query_id}, {task.region!r}, [{task.start}, {task.end})) does not "
                       f"match the plan ({plan.query_id}, {rr.region!r}, [{rr.start}, {rr.end}))")
    if not rr.start < task.end <= rr.end:
        return missing(f"it read up to {task.end}, outside its planned range [{rr.start}, {rr.end})")
    if task.rows and not (rr.start <= (task.first_offset or 0) and (task.last_offset or 0) < task.end):
        raise RegionalPlanError(
            f"epoch {plan.epoch}: region {rr.region!r} wrote offsets {task.first_offset}..{task.last_offset} "
            f"outside what its source read, [{rr.start}, {task.end}); the offset column must be the source's"
        )
    # Rows the query filtered out still count as done: the source read them.
    return RegionOutcome(rr.region, Outcome.WRITTEN, task.end, task.rows, seconds=task.seconds)


def outcomes_all_or_nothing(plan: EpochPlan, tasks: Sequence[TaskOutcome | None]) -> dict[str, RegionOutcome]:
    """A query whose plan moves rows between tasks (the JVM shim found a repartition, say): tasks do not
    match regions, so every region completes its whole range when every task wrote, and none does otherwise."""
    done = all(t is not None and t.status is Outcome.WRITTEN for t in tasks)
    rows: dict[str, int] = {}
    for task in tasks:
        for region, n in ((task.region_rows or {}) if task else {}).items():
            rows[region] = rows.get(region, 0) + n
    planned = {rr.region for rr in plan.regions}
    unknown = sorted(set(rows) - planned)
    if unknown:
        raise RegionalPlanError(f"epoch {plan.epoch}: the sink received rows of regions {unknown[:3]} that the "
                                "source did not plan in this epoch; the region column must be the source's")
    why = None if done else "a task of this all-or-nothing epoch failed"
    return {rr.region: RegionOutcome(rr.region, Outcome.WRITTEN if done else Outcome.FAILED,
                                     rr.end if done else rr.start, rows.get(rr.region, 0), why)
            for rr in plan.regions}


UNKNOWN_CAUSE = ("unknown: its attempts failed upstream of the sink, and no failure record says why (the "
                 "cause is recorded by regional's JVM shim)")


def with_failure_causes(plan: EpochPlan, outcomes: dict[str, RegionOutcome],
                        failures: Mapping[int, Sequence[TaskFailure]]) -> dict[str, RegionOutcome]:
    """Say why a quarantined region's attempts failed, from the JVM shim's failure records
    (partition i is the plan's region i): for a poisoned UDF, the UDF's exception. A dead-lettered
    record's reason is its ``error``: the exception's class and message."""
    named = dict(outcomes)
    at = {(rr.region, rr.start): i for i, rr in enumerate(plan.probes, start=len(plan.regions)) if rr.isolated}
    for region, tried in outcomes.items():
        if tried.members:
            named[region] = tried._replace(members=tuple(
                _member_cause(plan.settings, m, failures.get(at[region, m.offset], ())) for m in tried.members))
    for i, rr in enumerate(plan.regions):
        outcome, seen = named.get(rr.region), failures.get(i)
        if outcome is None or outcome.status not in UPSTREAM:
            continue
        if outcome.status is Outcome.DEAD_LETTERED:
            named[rr.region] = outcome._replace(reason=error_of(seen[-1]) if seen else UNKNOWN_CAUSE,
                                                verdict=verdict_of(plan.settings, seen or ()))
            continue
        if not seen:
            continue
        last = seen[-1]
        named[rr.region] = outcome._replace(reason=(
            f"quarantined after {len(seen)} failed attempt(s); attempt {last.attempt} on executor "
            f"{last.executor}: {last.message}"))
    return named


def _member_cause(settings: Settings, member: Member, seen: Sequence[TaskFailure]) -> Member:
    """A member that failed alone, with its own error and verdict (as its suspect's: ``with_failure_causes``)."""
    if member.status is not Outcome.DEAD_LETTERED:
        return member
    return member._replace(reason=error_of(seen[-1]) if seen else UNKNOWN_CAUSE, verdict=verdict_of(settings, seen))


def error_of(failure: TaskFailure) -> str:
    """A dead letter's ``error``. A Python worker's failure is recorded with its own exception line
    (``ValueError: ...``); any other names its JVM class first."""
    if failure.in_python:
        return failure.message
    return f"{failure.exception_class}: {failure.message}"


# -- The user's and the target's verdict (docs/dead-letters.md, "Your own verdict") -------------------------------

