"""Step 3 of an epoch, on the driver: what the tasks reported, checked against the plan, and the decision
(``docs/design.md``, "One epoch").

- ``TaskOutcome`` is a sink task's commit message; ``outcomes_from_tasks`` matches them to the planned
  regions and checks them: anything that does not add up is ``Outcome.MISSING`` (the region falls back).
- ``decide`` makes the epoch's record: the kind (global, regional, forced-global, aborted), what each
  region committed, which fell back and the epoch they still reference, and every region's state after it.
- Dead letters (``deadLetterPath`` or ``deadLetterTopic``): a quarantined region's range becomes its
  ``isolating`` range; later plans read it in halves (``plan.isolation_end``) until the failing record
  stands alone; when that one record fails on every attempt too, it is a suspect: it is dead-lettered, and its
  offset counts as done, only on evidence that it is poison and not an outage (``weigh_evidence``), on its last
  try (``deadLetterRetries``).
- ``regionTimeout``: a straggler's next ranges are sized to what it did within the timeout (``timed_range``).

Pure: plain functions over the store's model; no Spark, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any, NamedTuple

from regional.errors import RegionalDeadLetterLimitError, RegionalPlanError, RegionalSuspectTimeoutError
from regional.protocol.plan import PROBE_REACH, EpochPlan, RegionRange
from regional.protocol.settings import ALWAYS_OUTAGE, ALWAYS_POISON, Settings
from regional.store.model import (
    DeadLetter,
    EpochKind,
    EpochRecord,
    FallBack,
    RegionState,
    Slice,
    Standing,
    TaskFailure,
    suspect_backoff,
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


class Verdict(NamedTuple):
    """What the exception classes of an isolated record's failed attempts say, before any evidence."""

    poison: bool  # True: the record's fault, dead-lettered at once; False: an outage, never dead-lettered
    why: str  # the class and what named it, for the reason
    # The target's verdict (``RowsInvalid``): trusted only while records beside it pass the same target in the same
    # epoch, since a fault of the query or the table (a column left out, a rule changed) refuses every row alike.
    by_target: bool = False


# Python's exception line (``exception_line``):
# ``ValueError: bad``, ``json.decoder.JSONDecodeError: Expecting value: ...``, ``mymodule.MyError`` (an empty
# message), ``pkg.f.<locals>.MyError: ...`` (a class defined in a function). Anything else is no exception line.
_PART = r"(?:[^\W\d][\w$]*|<locals>)"
_EXCEPTION_LINE = re.compile(rf"({_PART}(?:\.{_PART})*)(?::(?:\s.*)?)?", re.DOTALL)


def failure_class(failure: TaskFailure) -> str | None:
    """The exception class one failed attempt raised, fully qualified as far as known. A Python worker's failure (a
    UDF, the regional source or sink) is the JVM's ``PythonException`` around Python's traceback: its class is that of
    the traceback's exception line (``ValueError``, ``json.decoder.JSONDecodeError``), read from the failure's whole
    description only where it leaves no doubt (``exception_line``). Any other failure's class is the JVM's. None
    when nothing can be named: no description, or an ambiguous one (then the evidence rule decides)."""
    if not failure.in_python:
        return failure.exception_class.strip() or None
    line = exception_line(failure.description)
    found = None if line is None else _EXCEPTION_LINE.fullmatch(line.strip())
    if found is None or found.group(1).endswith("<locals>"):
        return None
    return found.group(1)


_TRACEBACK = "Traceback (most recent call last):"
_SPARK_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+")
# What Python prints between the tracebacks of chained exceptions: only after these is a second traceback Python's.
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")


def exception_line(description: str | None) -> str | None:
    """The exception line of a Python traceback, or None where it is in doubt. A message may hold anything, a line
    that looks like another class's (``RuntimeError("upstream said:\nValueError: x")``), a traceback of its own,
    notes (``add_note``): so every traceback header but the first must follow a chained-exception separator, and
    after the last traceback's frames (indented) exactly one line may follow, the exception's."""
    if not description:
        return None
    lines = [line.rstrip() for line in description.splitlines() if line.strip()]
    if lines and _SPARK_SQLSTATE.fullmatch(lines[-1]):
        lines.pop()  # Spark's error-class suffix after the traceback (`` SQLSTATE: 38000``)
    # Spark's first line: ``[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (...):``
    headers = [i for i, line in enumerate(lines) if line.endswith(_TRACEBACK)]
    if not headers or any(lines[i].startswith((" ", "\t")) for i in headers):
        return None  # none, or an exception group's (indented): no single class
    if any(lines[h].strip() != _TRACEBACK or lines[h - 1].strip() not in _CHAINED for h in headers[1:]):
        return None  # a traceback inside a message
    rest = lines[headers[-1] + 1:]
    frames = 0
    while frames < len(rest) and rest[frames].startswith((" ", "\t")):
        frames += 1
    block = rest[frames:]
    return block[0] if frames and len(block) == 1 else None


def names_failure(name: str, cls: str, failure: TaskFailure) -> bool:
    """Whether the configured ``name`` names the class a failure raised: a Python worker's exception by
    ``class_matches``, a JVM failure only by its fully qualified Java name (a bare ``AssertionError`` meant for
    Python's ``assert`` must not name ``java.lang.AssertionError``, nor ``SparkException`` a crashed worker)."""
    if failure.in_python:
        return class_matches(name, cls)
    return name == cls


def class_matches(name: str, cls: str) -> bool:
    """Whether the configured ``name`` names the class ``cls``: the same simple name (the last part), and the name's
    module path, if any, a prefix of the class's. ``JSONDecodeError`` and ``json.JSONDecodeError`` name
    ``json.decoder.JSONDecodeError``; ``decoder.JSONDecodeError`` does not. Only names: a subclass is matched by its
    own name, never by its base class's (the driver sees the name of the class, not its bases)."""
    *module, simple = name.split(".")
    *cls_module, cls_simple = cls.split(".")
    return simple == cls_simple and cls_module[:len(module)] == module


def verdict_of(settings: Settings, failures: Sequence[TaskFailure]) -> Verdict | None:
    """The verdict of an isolated record's failed attempts (the JVM shim's failure records): an outage when any
    attempt raised a class named as one (``outageOn``, ``regional.Outage``); the record's fault when every attempt
    before the quarantine (``regionAttempts`` of them) is recorded and raised a class named as such
    (``deadLetterOn``, ``regional.PoisonRecord``, a target's ``RowsInvalid``); else None: the evidence rule decides
    (never a verdict on absent information)."""
    if not settings.isolates:
        return None
    classes = [(f, failure_class(f)) for f in failures]
    for f, cls in classes:
        if cls is None:
            continue
        for name in settings.outage_on:
            if names_failure(name, cls, f):
                return Verdict(False, f"{cls}, named by outageOn ({name})")
        if any(names_failure(name, cls, f) for name in ALWAYS_OUTAGE):
            return Verdict(False, f"{cls}, raised to say so")
    if not {f.attempt for f in failures} >= set(range(settings.region_attempts)):
        return None  # an attempt without a record: what it raised is not known
    whys, by_target = [], False
    for f, cls in classes:
        if cls is None:
            return None
        if any(names_failure(name, cls, f) for name in ALWAYS_POISON):
            target = cls.endswith("RowsInvalid")
            by_target = by_target or target
            why = f"{cls}, the target's verdict about the row" if target else f"{cls}, raised to say so"
        else:
            named = next((n for n in settings.dead_letter_on if names_failure(n, cls, f)), None)
            if named is None:
                return None
            why = f"{cls}, named by deadLetterOn ({named})"
        if why not in whys:
            whys.append(why)
    return Verdict(True, "; ".join(whys), by_target)


# -- The decision ---------------------------------------------------------------------------


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
