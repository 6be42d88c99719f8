"""One epoch, top to bottom: plan -> stage -> decide -> publish -> record (DESIGN.md section 5).

1. Plan (driver, the source's ``latestOffset``): ``plan_epoch``. Each region with work gets a
   range from its committed offset; the plan also carries the query id and the resolved
   settings, so tasks need nothing else. Spark logs it in ``offsets/N``; a restart re-runs it.
2. Stage (tasks): the source reads a range and leaves a read receipt; the sink stages the
   rows in the target and returns a ``TaskOutcome`` that says explicitly what happened.
3. Decide (driver, the sink's ``commit``): ``outcomes_from_tasks`` then ``decide``.
4. Publish: ``commit_epoch`` writes the intent, publishes the committed regions (and records isolated
   as poison, to the dead-letter table), discards the rest.
5. Record: the epoch record becomes the store's state; the target hears region by region.

Dead letters (``deadLetterPath``): a quarantined region's range becomes its ``isolating`` range; later
plans read it in halves (``isolation_end``) until the failing record is planned alone; when that one
record fails on every attempt too, it is dead-lettered and its offset counts as done.

Everything here is plain functions over small dataclasses; no Spark.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple, Protocol

from regional import failpoints
from regional.bulk import cyclic_gc_paused
from regional.errors import RegionalConfigError, RegionalDataLossError, RegionalPlanError, RegionalStoreError
from regional.protocol.settings import Settings
from regional.store.model import (
    DeadLetter,
    EpochKind,
    EpochRecord,
    FallBack,
    Intent,
    QueryPlanCheck,
    RegionState,
    Slice,
    Standing,
    TaskFailure,
)
from regional.targets.base import EpochReport, Target, commit_with_report

log = logging.getLogger("regional")

INITIAL_EPOCH = -1
FAILURE_RECORD_WAIT_S = 2.0
SWEEP_EVERY_EPOCHS = 5  # staged output that will never be published is removed at least this often


# -- 1. Plan --------------------------------------------------------------------------------


class RegionRange(NamedTuple):
    """What one region reads in one epoch: offsets ``start`` (inclusive) to ``end`` (exclusive).

    Per-region values built every epoch (this, ``RegionOutcome``, ``RegionState``, ``Slice``) are NamedTuples:
    immutable, and several times cheaper to build than frozen dataclasses, which matters at 10,000 regions."""

    region: str
    start: int
    end: int
    ref_epoch: int | None  # the epoch whose offset it still uses when it fell back; None when current
    isolated: bool = False  # one suspect record alone: if it fails on every attempt, it is dead-lettered


@dataclass(frozen=True)
class EpochPlan:
    """The offset Spark logs for one epoch. ``regions`` are the regions with work, sorted by id:
    Spark partition i reads ``regions[i]``. Regions without work are in the store, not here."""

    query_id: str
    epoch: int
    store: str  # the checkpoint whose regional store the plan was made against
    regions: tuple[RegionRange, ...]
    settings: Settings
    final: bool = False  # a bounded input: once this plan is published whole, nothing is left to read
    force_reason: str | None = None  # this epoch must be forced-global (a graceful stop asked for it)
    lost: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # region -> (from, to): skipped, gone

    def to_offset(self) -> dict[str, Any]:
        return {
            "query_id": self.query_id,
            "epoch": self.epoch,
            "store": self.store,
            "final": self.final,
            "force_reason": self.force_reason,
            "settings": self.settings.to_json(),
            "regions": [[r.region, r.start, r.end, r.ref_epoch, r.isolated] for r in self.regions],
            "lost": {r: list(span) for r, span in self.lost.items()},
        }

    @classmethod
    def from_offset(cls, offset: Mapping[str, Any]) -> EpochPlan:
        try:
            regions = tuple(RegionRange(str(r), int(s), int(e), None if ref is None else int(ref),
                                        bool(isolated[0]) if isolated else False)
                            for r, s, e, ref, *isolated in offset["regions"])
            force = offset["force_reason"]
            lost = {str(r): (int(a), int(b)) for r, (a, b) in offset.get("lost", {}).items()}
            return cls(str(offset["query_id"]), int(offset["epoch"]), str(offset["store"]), regions,
                       Settings.from_json(offset["settings"]), bool(offset["final"]),
                       None if force is None else str(force), lost)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RegionalStoreError(
                f"the offset {str(dict(offset))[:200]} was not written by this version of the regional source "
                f"({type(exc).__name__}: {exc}); a query cannot switch source formats on an existing checkpoint: "
                "start a new checkpointLocation"
            ) from None


def initial_offset(query_id: str, store: str) -> dict[str, Any]:
    """The offset before epoch 0: no region has a range yet."""
    return {"query_id": query_id, "epoch": INITIAL_EPOCH, "store": store, "initial": True}


@dataclass(frozen=True)
class Retention:
    """What a source whose log loses old records (Kafka) says at planning: where each region's log
    begins now, and whether losing records fails the query (``failOnDataLoss``)."""

    log_starts: Mapping[str, int]
    fail_on_data_loss: bool = True


@cyclic_gc_paused
def plan_epoch(
    epoch: int,
    query_id: str,
    store: str,
    states: Mapping[str, RegionState],
    available: Mapping[str, int],
    settings: Settings,
    max_per_region: int | None = None,
    max_total: int | None = None,
    ends: Mapping[str, int] | None = None,
    force_reason: str | None = None,
    first_offsets: Mapping[str, int] | None = None,
    retention: Retention | None = None,
) -> EpochPlan:
    """Plan ``epoch``: each known region from its committed offset to what is available.

    ``available[r]`` is the next offset region ``r`` will have (its end); a region missing from it has
    nothing new. A region not in ``states`` yet starts at ``first_offsets[r]``, else at its log start,
    else 0. ``max_per_region`` and ``max_total`` are read limits (admission control). ``ends`` are a
    bounded input's final ends: the plan that reaches them everywhere is final. ``retention``: records
    below a region's log start are gone; the plan skips them (recorded in ``lost``) or fails. A region
    that is isolating a poison record (``deadLetterPath``) reads the first half of its suspect range. With
    ``regionTimeout``, a straggler reads no more than its ``timed_range`` (see ``timed_range``).
    """
    backlog: dict[str, tuple[int, int]] = {}
    lost: dict[str, tuple[int, int]] = {}
    first = first_offsets or {}
    log_starts = retention.log_starts if retention else {}
    isolating = settings.enabled and settings.dead_letter_path is not None
    timed = settings.enabled and settings.region_timeout_s is not None
    alone: set[str] = set()  # regions whose range is to be one suspect record
    for region in sorted(set(states) | set(available)):
        state = states.get(region)
        start = state.committed_offset if state else first.get(region, log_starts.get(region, 0))
        end = available.get(region, start)
        if retention is not None and region in log_starts:
            log_start = log_starts[region]
            if end < start or start < log_start:
                skip = check_data_loss(region, start, end, log_start, retention.fail_on_data_loss)
                lost[region] = (start, skip)
                start = skip
        elif end < start:
            raise RegionalStoreError(
                f"region {region!r} now ends at offset {end} but offsets up to {start} were already committed: "
                "its input must be append-only; restore what was removed or start a new checkpointLocation"
            )
        if timed and state is not None and state.timed_range is not None:
            end = min(end, start + state.timed_range)  # a straggler: what it can do within regionTimeout
        if isolating and state is not None and state.isolating is not None and start < state.isolating[1]:
            end = min(end, isolation_end(start, state.isolating))
            if end == start + 1 == state.isolating[1]:
                alone.add(region)
        if max_per_region is not None:
            end = min(end, start + max_per_region)
        backlog[region] = (start, end)
    if max_total is not None:
        shares = share_read_limit({r: e - s for r, (s, e) in backlog.items()}, max_total, rotate=epoch)
        backlog = {r: (s, s + shares[r]) for r, (s, _e) in backlog.items()}
    final = ends is not None and all(e >= ends.get(r, e) for r, (_s, e) in backlog.items())
    ranges = tuple(RegionRange(r, s, e, states[r].ref_epoch if r in states else None,
                               r in alone and e == s + 1)
                   for r, (s, e) in backlog.items() if e > s)
    return EpochPlan(query_id, epoch, store, ranges, settings, final, force_reason, lost)


def isolation_end(start: int, suspect: tuple[int, int]) -> int:
    """Where an isolating region's range ends: the first half of what is left of its suspect range
    ``[lo, hi)`` (``start`` may be past ``lo``: a prefix of it committed). Bisection: each epoch halves
    the suspect range, so one poison record among n is alone after about log2(n) epochs."""
    left = suspect[1] - start
    return start + max(1, left // 2)


def check_data_loss(region: str, start: int, end: int, log_start: int, fail: bool) -> int:
    """A region's next offset is no longer in its log: fail (failOnDataLoss=true, Spark's default) or
    return where reading goes on (the log start)."""
    if end < start:
        what = (f"region {region!r} now ends at offset {end}, below its committed offset {start}: its log was "
                "truncated, or its topic deleted and created again")
    else:
        what = (f"records [{start}, {log_start}) of region {region!r} were deleted from its log (retention) "
                "before they were read")
    if fail:
        raise RegionalDataLossError(
            f"{what}. With failOnDataLoss=true (the default) the query stops. Set failOnDataLoss=false to go on "
            "from the log start (the loss is recorded in the epoch record and in status), or lengthen retention")
    return log_start


def share_read_limit(backlogs: Mapping[str, int], total: int, rotate: int = 0) -> dict[str, int]:
    """Split a total read limit between regions, max-min fair: small backlogs are served whole, the
    rest share evenly; what rounding leaves goes round-robin from a rotating start, so no region starves."""
    order = sorted(backlogs, key=lambda r: (backlogs[r], r))
    left, shares = max(total, 0), {}
    for i, region in enumerate(order):
        take = min(backlogs[region], left // (len(order) - i))
        shares[region] = take
        left -= take
    names = sorted(backlogs)
    for k in range(len(names)):
        if left <= 0:
            break
        region = names[(k + rotate) % len(names)]
        extra = min(backlogs[region] - shares[region], left)
        shares[region] += extra
        left -= extra
    return shares


# -- 2. Stage: what a task reports ----------------------------------------------------------


class Status(str, Enum):
    """What one task attempt says happened to its region."""

    WRITTEN = "written"  # staged what the source read: [start, end), a prefix of the range when cut
    FAILED = "failed"  # the sink's own work (the target's prepare) failed
    QUARANTINED = "quarantined"  # the attempt numbered regionAttempts: upstream failed before; read nothing
    MISSING = "missing"  # no trustworthy account of what was read (no receipt, a task that reported nothing)
    DEAD_LETTERED = "dead_lettered"  # an isolated record failed on every attempt: it goes to the dead-letter table


@dataclass(frozen=True)
class TaskOutcome:
    """The commit message of one sink task: explicit about what was read, written and staged."""

    partition: int
    attempt: int
    status: Status
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


class RegionOutcome(NamedTuple):
    """A planned region's outcome, checked against its plan."""

    region: str
    status: Status
    end: int  # exclusive end of what is done, for WRITTEN
    rows: int = 0
    reason: str | None = None
    dead_letter: bytes | None = None  # DEAD_LETTERED: the record, as the source read it (Arrow IPC)
    seconds: float | None = None  # WRITTEN: how long its slice took, from the source's first read to the target


def outcomes_from_tasks(plan: EpochPlan, tasks: Sequence[TaskOutcome | None]) -> dict[str, RegionOutcome]:
    """Match task outcomes to planned regions (partition i reads ``plan.regions[i]``) and check them.
    Anything that does not add up makes the region fall back (MISSING); rows of the wrong region fail."""
    if not plan.regions and all(t is None or not t.rows for t in tasks):
        return {}  # an empty epoch (a new query's batch 0 with nothing to read): Spark runs one empty task
    if len(tasks) != len(plan.regions):
        raise RegionalPlanError(
            f"epoch {plan.epoch}: the sink ran {len(tasks)} tasks for {len(plan.regions)} planned regions. "
            "A repartition, coalesce or other shuffle between the regional source and sink mixes regions; "
            "remove it, or set spark.regional.enabled=false"
        )
    outcomes = {}
    for i, (rr, task) in enumerate(zip(plan.regions, tasks, strict=True)):
        outcomes[rr.region] = _checked(plan, i, rr, task)
    return outcomes


def _checked(plan: EpochPlan, i: int, rr: RegionRange, task: TaskOutcome | None) -> RegionOutcome:
    def missing(why: str) -> RegionOutcome:
        return RegionOutcome(rr.region, Status.MISSING, rr.start, reason=why)

    if task is None:
        return missing("its task reported nothing")
    if task.partition != i:
        return missing(f"partition {i} reported as partition {task.partition}")
    if task.rows and task.region != rr.region:
        raise RegionalPlanError(
            f"epoch {plan.epoch}: sink task {i} received rows of region {task.region!r} but the source planned "
            f"{rr.region!r} there. An operator between source and sink moved rows between tasks (a shuffle); "
            "remove it, or set spark.regional.enabled=false"
        )
    if task.status is Status.QUARANTINED and rr.isolated:
        if task.query_id != plan.query_id or task.region != rr.region or task.start != rr.start:
            return missing(f"its quarantine receipt ({task.query_id}, {task.region!r}, {task.start}) does not match "
                           f"the plan ({plan.query_id}, {rr.region!r}, {rr.start})")
        if not task.dead_letter:
            return missing("its isolated record failed on every attempt, but the quarantined attempt could not read "
                           "it to dead-letter it")
        return RegionOutcome(rr.region, Status.DEAD_LETTERED, rr.end, reason=task.reason,
                             dead_letter=task.dead_letter)
    if task.status is not Status.WRITTEN:
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
    return RegionOutcome(rr.region, Status.WRITTEN, task.end, task.rows, seconds=task.seconds)


def outcomes_all_or_nothing(plan: EpochPlan, tasks: Sequence[TaskOutcome | None]) -> dict[str, RegionOutcome]:
    """A query whose plan moves rows between tasks (the JVM shim found a repartition, say): tasks do not
    match regions, so every region completes its whole range when every task wrote, and none does otherwise."""
    done = all(t is not None and t.status is Status.WRITTEN for t in tasks)
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
    return {rr.region: RegionOutcome(rr.region, Status.WRITTEN if done else Status.FAILED,
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
    for i, rr in enumerate(plan.regions):
        outcome, seen = outcomes.get(rr.region), failures.get(i)
        if outcome is None or outcome.status not in (Status.QUARANTINED, Status.DEAD_LETTERED):
            continue
        if outcome.status is Status.DEAD_LETTERED:
            named[rr.region] = outcome._replace(reason=error_of(seen[-1]) if seen else UNKNOWN_CAUSE)
            continue
        if not seen:
            continue
        last = seen[-1]
        named[rr.region] = outcome._replace(reason=(
            f"quarantined after {len(seen)} failed attempt(s); attempt {last.attempt} on executor "
            f"{last.executor}: {last.message}"))
    return named


def error_of(failure: TaskFailure) -> str:
    """A dead letter's ``error``. A Python worker's failure is recorded with its own exception line
    (``ValueError: ...``); any other names its JVM class first."""
    if failure.exception_class.endswith("PythonException"):
        return failure.message
    return f"{failure.exception_class}: {failure.message}"


# -- 3. Decide ----------------------------------------------------------------------------


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

    With ``deadLetterPath``, a quarantined range becomes the region's ``isolating`` range (even in an
    aborted epoch: what failed on every attempt is known, publishing or not); a committed prefix of it
    shortens it; a dead-lettered record (an isolated one that failed on every attempt) counts as done.
    While the isolating range narrows, the region's quarantines count neither as consecutive failures nor
    towards ``maxFailureRatio``: isolation is progress, and must not hold back the healthy regions."""
    settings = plan.settings
    isolation = settings.enabled and settings.dead_letter_path is not None
    before = previous.regions if previous else {}
    seen = {rr.region: outcomes.get(rr.region) or RegionOutcome(rr.region, Status.MISSING, rr.start,
                                                                reason="no outcome")
            for rr in plan.regions}
    failed = {r: o for r, o in seen.items() if o.status not in (Status.WRITTEN, Status.DEAD_LETTERED)}
    narrowing = {rr.region for rr in plan.regions if isolation and rr.region in failed
                 and failed[rr.region].status is Status.QUARANTINED and narrows(before.get(rr.region), rr)}
    force_reason = force_reason or plan.force_reason or forced_global_reason(before, settings)
    reset_counters = False
    if not failed:
        kind, reason = (EpochKind.FORCED_GLOBAL, force_reason) if force_reason else (EpochKind.GLOBAL, None)
    elif not settings.enabled:
        kind, reason = EpochKind.ABORTED, "regional epochs are disabled (spark.regional.enabled=false)"
    elif force_reason:
        # Tier 2: the forced-global epoch failed. Publish nothing, reset counters, go on.
        kind, reason, reset_counters = EpochKind.ABORTED, f"forced global epoch failed: {force_reason}", True
    elif len(failed) - len(narrowing) > settings.max_failure_ratio * len(plan.regions):
        kind = EpochKind.ABORTED
        reason = (f"{len(failed) - len(narrowing)} of {len(plan.regions)} regions with work failed, more than "
                  f"maxFailureRatio={settings.max_failure_ratio}"
                  + (f" ({len(narrowing)} more are isolating poison records)" if narrowing else ""))
    else:
        kind, reason = EpochKind.REGIONAL, None

    timeout = settings.region_timeout_s if settings.enabled else None
    slow = straggler_cost(plan, seen) if timeout is not None else None
    committed: dict[str, Slice] = {}
    fallen_back: dict[str, FallBack] = {}
    dead_lettered: dict[str, DeadLetter] = {}
    regions = dict(before)  # regions without work keep their state
    for rr in plan.regions:
        # A region's range starts at its committed offset, or where it first starts, or past lost records.
        state, outcome = before.get(rr.region), seen[rr.region]
        if state is None:
            state = RegionState(committed_offset=rr.start)
        if kind is not EpochKind.ABORTED and rr.region not in failed:
            # RegionState(...) rather than ._replace: this loop runs once per region with work, and a copy
            # with changes costs several times more (10,000 regions: tens of ms of the driver's epoch).
            if outcome.status is Status.DEAD_LETTERED:
                dead_lettered[rr.region] = DeadLetter(rr.start, outcome.reason or UNKNOWN_CAUSE)
                regions[rr.region] = RegionState(outcome.end, plan.epoch,
                                                 dead_letters=state.dead_letters + (rr.end - rr.start),
                                                 timed_range=state.timed_range if timeout else None)
                continue
            committed[rr.region] = Slice(rr.start, outcome.end, outcome.rows, cut=outcome.end < rr.end)
            span = outcome.end - rr.start
            regions[rr.region] = RegionState(
                outcome.end, plan.epoch, isolating=rest_of_isolation(state.isolating, outcome.end),
                dead_letters=state.dead_letters,
                timed_range=None if timeout is None else timed_range(
                    timeout, state.timed_range, span, outcome.seconds,
                    slow is not None and outcome.seconds is not None and outcome.seconds > slow * span))
            continue
        own = failed.get(rr.region)
        why = own.reason if own and own.reason else f"epoch aborted: {reason}"
        quarantined = own is not None and own.status is Status.QUARANTINED
        narrowed = rr.region in narrowing  # the whole planned range failed on every attempt: the poison is in it
        isolating = (rr.start, rr.end) if narrowed else state.isolating
        counted = own is not None and not narrowed
        regions[rr.region] = RegionState(
            rr.start, state.last_epoch, 0 if reset_counters else state.consecutive_failures + counted,
            Standing.QUARANTINED if quarantined else Standing.FALLEN_BACK, why, isolating, state.dead_letters,
            state.timed_range if timeout else None)
        ref = regions[rr.region].ref_epoch
        fallen_back[rr.region] = FallBack(-1 if ref is None else ref, why, quarantined)
    planned = {rr.region for rr in plan.regions}
    for region, (_gone_from, go_on) in plan.lost.items():  # lost records are gone, work or not
        if region not in planned:
            regions[region] = regions.get(region, RegionState())._replace(committed_offset=go_on)
    regional = (previous.regional_epochs if previous else 0) + (kind is EpochKind.REGIONAL)
    return EpochRecord(plan.epoch, kind, committed, fallen_back, regions, reason, regional, now, dict(plan.lost),
                       dead_lettered)


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
                   if (o := seen[rr.region]).status is Status.WRITTEN and o.seconds is not None and o.end > rr.start)
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


# -- 4. Publish and 5. record ----------------------------------------------------------------


class EpochStore(Protocol):
    """What phase two needs of the store (``regional.store.Store``)."""

    def query_id(self) -> str | None: ...
    def read_record(self, epoch: int) -> EpochRecord | None: ...
    def latest_record(self, before: int | None = None) -> EpochRecord | None: ...
    def read_intent(self, epoch: int) -> Intent | None: ...
    def write_intent(self, epoch: int, intent: Intent) -> None: ...
    def write_record(self, record: EpochRecord) -> None: ...
    def prune(self, retain_epochs: int, latest: EpochRecord | None = None) -> None: ...
    def read_query_plan(self) -> QueryPlanCheck | None: ...
    def read_failures(self, epoch: int) -> dict[int, list[TaskFailure]]: ...


@cyclic_gc_paused
def commit_epoch(plan: EpochPlan, tasks: Sequence[TaskOutcome | None], store: EpochStore, target: Target,
                 mixed: bool = False) -> EpochRecord:
    """Phase two of one epoch, on the driver. Idempotent: a re-run after a crash publishes nothing twice
    and records what was really published the first time. ``mixed``: the plan moves rows between tasks,
    so the epoch is all-or-nothing and handles are per task."""
    epoch = plan.epoch
    staged_now = {t.region if t.region and not mixed else f"#{t.partition}": t.handle
                  for t in tasks if t is not None and t.handle is not None}
    if plan.query_id != store.query_id():
        target.abort(epoch, staged_now)
        raise RegionalStoreError(
            f"epoch {epoch} was planned for query {plan.query_id} but the regional store belongs to query "
            f"{store.query_id()}: the store was replaced while the query ran. Restore it, or start a new "
            "checkpointLocation"
        )

    # 0. Already recorded: only this re-run's own staging is left to discard.
    recorded = store.read_record(epoch)
    if recorded is not None:
        target.abort(epoch, staged_now)
        notify(target, recorded)  # at least once: the crash may have come before it
        return recorded

    # 3. Decide, or take the decision of an interrupted earlier run of this epoch.
    intent = store.read_intent(epoch)
    if intent is None:
        if getattr(target, "published", None) is not None and target.published(epoch):  # type: ignore[attr-defined]
            raise RegionalStoreError(
                f"epoch {epoch} is already published in the target, but the regional store at {store!r} has "
                "neither its intent nor its record: the store was damaged. Restore it from a backup, or start "
                "a new checkpointLocation (and a new target)")
        outcomes = outcomes_all_or_nothing(plan, tasks) if mixed else outcomes_from_tasks(plan, tasks)
        upstream = [i for i, rr in enumerate(plan.regions)
                    if outcomes[rr.region].status in (Status.QUARANTINED, Status.DEAD_LETTERED)]
        if upstream:  # the shim, when loaded, records why attempts failed
            shim = store.read_query_plan() is not None
            outcomes = with_failure_causes(plan, outcomes, wait_for_failures(store, epoch, upstream) if shim else {})
        record = decide(plan, outcomes, store.latest_record(before=epoch), now=time.time())
        if mixed:
            publish = dict(staged_now) if record.committed else {}
        else:
            publish = {r: staged_now[r] for r in record.committed if r in staged_now}
        letters, path = {}, plan.settings.dead_letter_path
        if record.dead_lettered:
            assert path is not None  # only a plan with deadLetterPath isolates records
            records = {r: (outcomes[r].dead_letter or b"", d.offset, d.error) for r, d in record.dead_lettered.items()}
            letters = dead_letter_table(path, plan.query_id).stage(epoch, records)
        intent = Intent(record, publish, {r: h for r, h in staged_now.items() if r not in publish}, letters,
                        path if letters else None)
        _require_json_handles(epoch, intent, target)
        # The write-ahead intent: from here on, this epoch's outcome is fixed.
        store.write_intent(epoch, intent)
    else:  # decided by a run that died before ready_target of the re-run could finish it
        log.warning("regional: epoch %d was interrupted after its decision; finishing it as decided", epoch)
        intent = Intent(intent.record, intent.publish,
                        {**intent.discard, **{f"rerun:{r}": h for r, h in staged_now.items()}})
    return publish_and_record(intent, store, target, plan.settings.retain_epochs)


def publish_and_record(intent: Intent, store: EpochStore, target: Target, retain_epochs: int | None) -> EpochRecord:
    """Steps 4 and 5 of a decided epoch; a re-run repeats them safely (the target acts once)."""
    record = intent.record
    epoch = record.epoch
    failpoints.reach("before_publish", epoch)

    # 4. Publish the dead letters, then the committed regions' slices (each atomic and idempotent in its
    #    table), and discard the rest.
    if intent.dead_letters:
        if intent.dead_letter_path is None:
            raise RegionalStoreError(f"the intent of epoch {epoch} holds dead letters but no deadLetterPath: the "
                                     "store was damaged. Restore it, or start a new checkpointLocation")
        failpoints.reach("before_dead_letters", epoch)
        dead_letter_table(intent.dead_letter_path, record_query_id(store, epoch)).publish(epoch, intent.dead_letters)
        failpoints.reach("after_dead_letters", epoch)
    if record.committed:
        commit_with_report(target, epoch, intent.publish, report_of(record))
    failpoints.reach("before_record", epoch)
    if intent.discard:
        target.abort(epoch, intent.discard)

    # 5. Record the epoch: the store's state now includes it. Then clean up, and tell the target.
    store.write_record(record)
    if retain_epochs is not None:
        store.prune(retain_epochs, latest=record)
    if epoch % SWEEP_EVERY_EPOCHS == 0 and callable(getattr(target, "sweep", None)):
        target.sweep(epoch)  # type: ignore[attr-defined]
    log.info("regional: %s", describe(record))
    notify(target, record)
    return record


def dead_letter_table(path: str, query_id: str) -> Any:
    """The dead-letter Delta table at ``path`` (``regional.dead_letters``; imported here so that
    planning and deciding need no Delta)."""
    from regional.dead_letters import DeadLetterTable

    return DeadLetterTable(path, query_id)


def record_query_id(store: EpochStore, epoch: int) -> str:
    query_id = store.query_id()
    if query_id is None:
        raise RegionalStoreError(f"epoch {epoch}: the regional store has no query id: it was damaged. Restore it, "
                                 "or start a new checkpointLocation")
    return query_id


def ready_target(store: EpochStore, target: Target, schema: Any) -> EpochRecord | None:
    """On the driver, before an epoch's tasks run (the sink is built for every epoch):

    1. the target checks itself and creates what is missing (its optional ``open(schema)``);
    2. an epoch decided but not recorded when the driver died is finished as decided now, not after its
       re-run's tasks: staged slices that hold locks (PostgreSQL's prepared transactions) would block them;
    3. what recorded epochs staged but never published (dead tasks and drivers) is swept.

    Returns the record of the epoch it finished, if any."""
    if callable(getattr(target, "open", None)):
        target.open(schema)  # type: ignore[attr-defined]
    latest = store.latest_record()
    finished = None
    intent = store.read_intent(latest.epoch + 1 if latest else 0)
    if intent is not None:
        log.warning("regional: epoch %d was interrupted after its decision; finishing it as decided",
                    intent.record.epoch)
        finished = latest = publish_and_record(intent, store, target, None)
    if latest is not None and callable(getattr(target, "sweep", None)):
        target.sweep(latest.epoch)  # type: ignore[attr-defined]
    return finished


def _require_json_handles(epoch: int, intent: Intent, target: Target) -> None:
    try:
        json.dumps({"publish": intent.publish, "discard": intent.discard})
    except (TypeError, ValueError) as exc:
        target.abort(epoch, {r: h for r, h in {**intent.publish, **intent.discard}.items()})
        raise RegionalConfigError(
            f"the target's prepare() returned a handle that is not JSON-serialisable ({exc}); handles go into "
            "the store's write-ahead intent: return str, int, float, bool, None, lists or dicts of them"
        ) from None


def wait_for_failures(store: EpochStore, epoch: int, partitions: Sequence[int],
                      timeout_s: float = FAILURE_RECORD_WAIT_S) -> dict[int, list[TaskFailure]]:
    """The shim's SparkListener runs on Spark's asynchronous listener bus: give its records of these
    partitions' failed attempts a moment to land."""
    deadline = time.monotonic() + timeout_s
    while True:
        failures = store.read_failures(epoch)
        if all(p in failures for p in partitions) or time.monotonic() >= deadline:
            return failures
        time.sleep(0.05)


def notify(target: Target, record: EpochRecord) -> None:
    """Region-level notification (FLIP-600's partially completed checkpoint), if the target wants it:
    ``on_epoch(epoch, committed={region: (start, end)}, fallen_back={region: (ref_epoch, reason)})``."""
    on_epoch = getattr(target, "on_epoch", None)
    if callable(on_epoch):
        report = report_of(record)
        on_epoch(record.epoch, report.committed, report.fallen_back)


def report_of(record: EpochRecord) -> EpochReport:
    return EpochReport(
        epoch=record.epoch,
        kind=record.kind.value,
        committed={r: (s.start, s.end) for r, s in record.committed.items()},
        fallen_back={r: (f.ref_epoch, f.reason) for r, f in record.fallen_back.items()},
        rows={r: s.rows for r, s in record.committed.items()},
    )


def describe(record: EpochRecord) -> str:
    """One line per epoch: kind, regions committed, regions fallen back with ref_epoch."""
    fallen = ", ".join(f"{r}(ref_epoch={f.ref_epoch}{', quarantined' if f.quarantined else ''})"
                       for r, f in sorted(record.fallen_back.items()))
    line = (f"epoch {record.epoch}: {record.kind.value}; committed {len(record.committed)} "
            f"[{', '.join(sorted(record.committed))}]; fallen back {len(record.fallen_back)}"
            + (f" [{fallen}]" if fallen else ""))
    if record.dead_lettered:
        line += (f"; dead-lettered {len(record.dead_lettered)} ["
                 + ", ".join(f"{r}@{d.offset}" for r, d in sorted(record.dead_lettered.items())) + "]")
    if record.reason:
        line += f"; {record.reason}"
    return line
