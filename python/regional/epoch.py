"""The epoch protocol on the driver: plan -> stage -> decide -> publish -> record.

Planning happens in the source (``plan.plan_epoch``) and staging in the tasks
(``sink.RegionalStreamWriter.write``). This module is the rest, in order, as
plain functions; the sink's ``commit`` is a thin call into ``commit_epoch``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from regional import failpoints
from regional.committers import Committer, EpochReport, commit_with_report
from regional.config import RegionalPolicy
from regional.decision import RegionOutcome, Status, decide
from regional.errors import RegionalConfigError, RegionalPlanError
from regional.plan import EpochPlan
from regional.store import EpochRecord, Intent, Store, TaskFailure

log = logging.getLogger("regional")

FAILURE_RECORD_WAIT_S = 2.0


@dataclass(frozen=True)
class TaskReport:
    """What one task's sink reports for its region (phase one's result)."""

    partition: int
    attempt: int
    status: Status
    region: str | None = None  # from the rows; None when no row arrived
    first_offset: int | None = None
    last_offset: int | None = None
    rows: int = 0
    handle: Any = None  # the committer's staged handle
    reason: str | None = None  # why it failed
    region_rows: dict[str, int] | None = None  # an all-or-nothing task holding many regions: rows per region


def outcomes_from_reports(
    plan: EpochPlan,
    reports: Sequence[TaskReport | None],
    cuts: Callable[[TaskReport], tuple[str, int] | None] = lambda report: None,
) -> dict[str, RegionOutcome]:
    """Match task reports to planned regions (partition i reads plan.regions[i]) and check them.

    ``cuts`` finds where the source stopped reading a task's region at its
    ``regionTimeout``; only that prefix of the range is done.
    """
    if len(reports) != len(plan.regions):
        raise RegionalPlanError(
            f"epoch {plan.epoch}: the sink ran {len(reports)} tasks for {len(plan.regions)} planned regions. "
            "A repartition, coalesce or other shuffle between the regional source and sink mixes regions; "
            "remove it, or set spark.regional.enabled=false"
        )
    outcomes = {}
    for i, (rr, report) in enumerate(zip(plan.regions, reports, strict=False)):
        if report is None:
            outcomes[rr.region] = RegionOutcome(rr.region, Status.FAILED, rr.start, reason="task reported nothing")
            continue
        if report.partition != i or (report.region is not None and report.region != rr.region):
            raise RegionalPlanError(
                f"epoch {plan.epoch}: sink task {report.partition} received region {report.region!r} "
                f"but the source planned {rr.region!r} there. An operator between source and sink moved "
                "rows between tasks (a shuffle); remove it, or set spark.regional.enabled=false"
            )
        if report.rows and not (rr.start <= (report.first_offset or 0) and (report.last_offset or 0) < rr.end):
            raise RegionalPlanError(
                f"epoch {plan.epoch}: region {rr.region!r} wrote offsets {report.first_offset}..{report.last_offset} "
                f"outside its planned range [{rr.start}, {rr.end}); the offset column must be the source's"
            )
        if rr.has_work:
            # A task that succeeded read its whole range (or up to its cut): rows the query
            # filtered out still count as done.
            end = rr.end if report.status is Status.WRITTEN else rr.start
            cut = cuts(report) if report.status is Status.WRITTEN else None
            if cut is not None:
                region, end = cut
                if region != rr.region or not rr.start <= end <= rr.end or (
                        report.rows and (report.last_offset or 0) >= end):
                    raise RegionalPlanError(f"epoch {plan.epoch}: the timeout cut {cut} of partition {i} does "
                                            f"not fit region {rr.region!r} [{rr.start}, {rr.end})")
            outcomes[rr.region] = RegionOutcome(rr.region, report.status, end, report.rows, report.reason)
    return outcomes


def outcomes_all_or_nothing(plan: EpochPlan, reports: Sequence[TaskReport | None]) -> dict[str, RegionOutcome]:
    """A query whose plan moves rows between tasks (the JVM shim found a repartition, say): tasks do not
    match regions, so every region with work completes its whole range when every task wrote, and none does
    otherwise."""
    done = all(r is not None and r.status is Status.WRITTEN for r in reports)
    rows: dict[str, int] = {}
    for report in reports:
        for region, n in ((report.region_rows or {}) if report else {}).items():
            rows[region] = rows.get(region, 0) + n
    planned = {rr.region for rr in plan.regions if rr.has_work}
    unknown = sorted(set(rows) - planned)
    if unknown:
        raise RegionalPlanError(f"epoch {plan.epoch}: the sink received rows of regions {unknown[:3]} that the "
                                "source did not plan in this epoch; the region column must be the source's")
    why = None if done else "a task of this all-or-nothing epoch failed"
    return {rr.region: RegionOutcome(rr.region, Status.WRITTEN if done else Status.FAILED,
                                     rr.end if done else rr.start, rows.get(rr.region, 0), why)
            for rr in plan.regions if rr.has_work}


def with_failure_causes(
    plan: EpochPlan, outcomes: dict[str, RegionOutcome], failures: Mapping[int, Sequence[TaskFailure]],
) -> dict[str, RegionOutcome]:
    """Say why a quarantined region's attempts failed, from the JVM shim's failure records
    (partition i is the plan's region i): for a poisoned UDF, the UDF's exception."""
    named = dict(outcomes)
    for i, rr in enumerate(plan.regions):
        outcome, seen = outcomes.get(rr.region), failures.get(i)
        if outcome is None or outcome.status is not Status.QUARANTINED or not seen:
            continue
        last = seen[-1]
        reason = (f"quarantined after {len(seen)} failed attempt(s); attempt {last.attempt} on executor "
                  f"{last.executor}: {last.message}")
        named[rr.region] = replace(outcome, reason=reason)
    return named


def wait_for_failures(store: Store, epoch: int, partitions: Sequence[int],
                      timeout_s: float = FAILURE_RECORD_WAIT_S) -> dict[int, list[TaskFailure]]:
    """The shim's SparkListener runs on Spark's asynchronous listener bus: give its records of these
    partitions' failed attempts a moment to land."""
    deadline = time.monotonic() + timeout_s
    while True:
        failures = store.read_failures(epoch)
        if all(p in failures for p in partitions) or time.monotonic() >= deadline:
            return failures
        time.sleep(0.05)


def commit_epoch(
    plan: EpochPlan,
    reports: Sequence[TaskReport | None],
    store: Store,
    committer: Committer,
    policy: RegionalPolicy,
    force_reason: str | None = None,
    mixed: bool = False,
) -> EpochRecord:
    """Phase two of one epoch. Idempotent: a re-run after a crash publishes nothing twice
    and records what was really published the first time.

    ``mixed``: the plan moves rows between tasks, so the epoch is all-or-nothing."""
    epoch = plan.epoch
    staged_now = {r.region or f"#{r.partition}": r.handle
                  for r in reports if r is not None and r.handle is not None}
    if plan.store and plan.store != str(store.checkpoint):
        committer.abort(epoch, staged_now)
        raise RegionalConfigError(
            f"the regional source planned against the store at {plan.store} but the sink's checkpointLocation "
            f"is {store.checkpoint}: give readStream the same checkpointLocation as writeStream"
        )

    # 0. Already recorded: only this re-run's own staging is left to discard.
    recorded = store.read_record(epoch)
    if recorded is not None:
        committer.abort(epoch, staged_now)
        notify(committer, recorded)  # at least once: the crash may have come before it
        return recorded

    # 1. Decide, or take the decision of an interrupted earlier run of this epoch.
    intent = store.read_intent(epoch)
    if intent is None:
        if mixed:
            outcomes = outcomes_all_or_nothing(plan, reports)
        else:
            outcomes = outcomes_from_reports(plan, reports,
                                             cuts=lambda r: store.read_cut(epoch, r.partition, r.attempt))
        quarantined = [i for i, rr in enumerate(plan.regions)
                       if rr.region in outcomes and outcomes[rr.region].status is Status.QUARANTINED]
        if quarantined and store.read_query_plan() is not None:  # the shim records failed attempts
            outcomes = with_failure_causes(plan, outcomes, wait_for_failures(store, epoch, quarantined))
        previous = store.latest_record(before=epoch)
        force_reason = force_reason or plan.force_reason
        decision = decide(plan, outcomes, previous.regions if previous else {}, policy, force_reason)
        record = EpochRecord.from_decision(epoch, decision, previous)
        if mixed:  # handles are per task, not per region
            publish = dict(staged_now) if decision.committed else {}
        else:
            publish = {r: staged_now[r] for r in decision.committed if r in staged_now}
        discard = {r: h for r, h in staged_now.items() if r not in publish}
        intent = Intent(record, publish, discard)
        # 2. Write-ahead intent: from here on, this epoch's outcome is fixed.
        store.write_intent(epoch, intent)
    else:
        log.warning("regional: epoch %d was interrupted after its decision; finishing it as decided", epoch)
        discard = {**intent.discard, **{f"rerun:{r}": h for r, h in staged_now.items()}}
        intent = Intent(intent.record, intent.publish, discard)
    failpoints.reach("before_publish", epoch)

    # 3. Publish the committed regions' slices (atomic and idempotent in the committer).
    record = intent.record
    report = report_of(record)
    if record.committed:
        commit_with_report(committer, epoch, intent.publish, report)
    failpoints.reach("before_record", epoch)

    # 4. Discard what was staged and not chosen.
    if intent.discard:
        committer.abort(epoch, intent.discard)

    # 5. Record the epoch: the store's state now includes it.
    store.write_record(record)
    store.prune(policy.retain_epochs)
    log.info("regional: %s", describe(record))

    # 6. Tell the committer, region by region.
    notify(committer, record)
    return record


def notify(committer: Committer, record: EpochRecord) -> None:
    """Region-level notification (FLIP-600's partially-completed checkpoint), if the committer wants it:
    ``on_epoch(epoch, committed={region: (start, end)}, fallen_back={region: (ref_epoch, reason)})``."""
    on_epoch = getattr(committer, "on_epoch", None)
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
    if record.reason:
        line += f"; {record.reason}"
    return line
