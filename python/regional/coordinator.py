"""Phase two of an epoch, on the driver: its side effects, as numbered steps (``docs/design.md``, "One epoch").

The only caller of a target's ``open``, ``commit``, ``abort`` and ``sweep``. Its collaborators are passed in:
the query's store (``EpochStore``), its target, and the factory of its dead-letter sink. What to publish is
decided by the pure ``regional.protocol.decide``; everything here acts on that decision.

Before an epoch's tasks run, ``ready_target``:

1. the target checks itself and creates what is missing (``Target.open``);
2. an epoch decided but not recorded when the driver died is finished as decided (steps 5 to 8);
3. what recorded epochs staged but never published is swept.

After the tasks, ``commit_epoch``:

4. decide (or take the decision of an interrupted run), stage the dead letters, and write the intent:
   from here on the epoch's outcome is fixed, and a re-run finishes exactly this;
5. publish the dead letters;
6. publish the committed regions' slices, and discard the rest;
7. record the epoch: the store's state now includes it; prune old records, sweep now and then;
8. notify the target region by region.

Each step is idempotent: a re-run after a crash at any point publishes nothing twice.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pyarrow as pa

from regional import failpoints
from regional.bulk import cyclic_gc_paused
from regional.dead_letters import dead_letter_rows
from regional.errors import (
    NEW_QUERY,
    RegionalConfigError,
    RegionalDeadLetterLimitError,
    RegionalPlanError,
    RegionalStoreError,
)
from regional.protocol.decide import (
    UNKNOWN_CAUSE,
    RegionOutcome,
    TaskOutcome,
    decide,
    outcomes_all_or_nothing,
    outcomes_from_tasks,
    upstream_partitions,
    with_failure_causes,
)
from regional.protocol.plan import EpochPlan
from regional.store.model import EpochRecord, Intent, QueryPlanCheck, TaskFailure, describe
from regional.targets import dead_letter_place, dead_letter_target
from regional.targets.base import EpochReport, Target

log = logging.getLogger("regional")

FAILURE_RECORD_WAIT_S = 2.0
SWEEP_EVERY_EPOCHS = 5  # staged output that will never be published is removed at least this often

# (place, query id) -> the dead letters' target; a place is a Delta table's path or ``kafka:<topic>``
DeadLetterSink = Callable[[str, str], Target[Any]]


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


def ready_target(store: EpochStore, target: Target[Any], schema: pa.Schema,
                 dead_letter_sink: DeadLetterSink = dead_letter_target) -> EpochRecord | None:
    """Steps 1 to 3, on the driver before an epoch's tasks run. Returns the record of the interrupted epoch it
    finished, if any: staged slices that hold locks (PostgreSQL's prepared transactions) would block its
    re-run's tasks, so it is finished now, not after them."""
    # 1. The target checks itself: a bad target fails at start, not in a task.
    target.open(schema)
    # 2. Finish an epoch decided by a driver that died before recording it.
    latest = store.latest_record()
    finished = None
    intent = store.read_intent(latest.epoch + 1 if latest else 0)
    if intent is not None:
        log.warning("regional: epoch %d was interrupted after its decision; finishing it as decided",
                    intent.record.epoch)
        finished = latest = finish(intent, store, target, dead_letter_sink, retain_epochs=None)
    # 3. Sweep what recorded epochs staged and never published.
    if latest is not None:
        target.sweep(latest.epoch)
    return finished


@cyclic_gc_paused
def commit_epoch(plan: EpochPlan, tasks: Sequence[TaskOutcome | None], store: EpochStore, target: Target[Any],
                 mixed: bool = False, dead_letter_sink: DeadLetterSink = dead_letter_target) -> EpochRecord:
    """Steps 4 to 8 of one epoch, from its tasks' outcomes. Idempotent: a re-run after a crash publishes
    nothing twice and records what was really published the first time. ``mixed``: the query's plan moves
    rows between tasks (the JVM shim's plan check), so the epoch is all-or-nothing and handles are per task."""
    epoch = plan.epoch
    # Keyed by region; a task that holds many regions (mixed) or a probe (never published) by its partition.
    regions = len(plan.regions)
    staged_now = {t.region if t.region and not mixed and t.partition < regions else f"#{t.partition}": t.handle
                  for t in tasks if t is not None and t.handle is not None}
    if plan.query_id != store.query_id():
        target.abort(epoch, staged_now)
        raise RegionalStoreError(
            f"epoch {epoch} was planned for query {plan.query_id} but the regional store belongs to query "
            f"{store.query_id()}: the store was replaced while the query ran. Restore it, or start a new "
            "checkpointLocation"
        )
    recorded = store.read_record(epoch)
    if recorded is not None:  # a re-run after the record: only its own staging is left to discard
        target.abort(epoch, staged_now)
        notify(target, recorded)  # at least once: the crash may have come before it
        return recorded

    # 4. Decide, or take the decision of an interrupted earlier run; then the write-ahead intent.
    intent = store.read_intent(epoch)
    if intent is None:
        if target.published(epoch):
            raise RegionalStoreError(
                f"epoch {epoch} is already published in the target, but the regional store at {store!r} has "
                "neither its intent nor its record: the store was damaged. Restore it from a backup, or "
                + NEW_QUERY)
        try:
            intent = decided_intent(plan, tasks, store, target, staged_now, mixed, dead_letter_sink)
        except (RegionalPlanError, RegionalDeadLetterLimitError):
            target.abort(epoch, staged_now)  # the query fails: nothing of this epoch is published
            raise
        store.write_intent(epoch, intent)  # from here on, this epoch's outcome is fixed
    else:  # decided by a run that died before ready_target of the re-run could finish it
        log.warning("regional: epoch %d was interrupted after its decision; finishing it as decided", epoch)
        intent = Intent(intent.record, intent.publish,
                        {**intent.discard, **{f"rerun:{r}": h for r, h in staged_now.items()}},
                        intent.dead_letters, intent.dead_letter_path, intent.dead_letter_topic)
    return finish(intent, store, target, dead_letter_sink, plan.settings.retain_epochs)


def decided_intent(plan: EpochPlan, tasks: Sequence[TaskOutcome | None], store: EpochStore, target: Target[Any],
                   staged_now: dict[str, Any], mixed: bool, dead_letter_sink: DeadLetterSink) -> Intent:
    """Step 4: the decision, the dead letters staged, and what to publish and discard, as one intent."""
    outcomes = outcomes_all_or_nothing(plan, tasks) if mixed else outcomes_from_tasks(plan, tasks)
    upstream = upstream_partitions(plan, outcomes)
    if upstream:  # the shim, when loaded, records why attempts failed
        shim = store.read_query_plan() is not None
        outcomes = with_failure_causes(plan, outcomes, wait_for_failures(store, plan.epoch, upstream) if shim else {})
    record = decide(plan, outcomes, store.latest_record(before=plan.epoch), now=time.time())
    if mixed:
        publish = dict(staged_now) if record.committed else {}
    else:
        publish = {r: staged_now[r] for r in record.committed if r in staged_now}
    path, topic, letters = plan.settings.dead_letter_path, plan.settings.dead_letter_topic, {}
    if record.dead_lettered:
        letters = stage_dead_letters(record, outcomes, dead_letter_place(path, topic), plan.query_id,
                                     dead_letter_sink)
    intent = Intent(record, publish, {r: h for r, h in staged_now.items() if r not in publish}, letters,
                    path if letters else None, topic if letters else None)
    _require_json_handles(plan.epoch, intent, target)
    return intent


def stage_dead_letters(record: EpochRecord, outcomes: dict[str, RegionOutcome], location: str | None,
                       query_id: str, dead_letter_sink: DeadLetterSink) -> dict[str, Any]:
    """Each dead-lettered region's record (as the source read it, with ``epoch`` and ``error``) staged in the
    dead-letter sink, on the driver, before the intent. Anything staged there already for this epoch or an
    older one was left by a driver that died before its intent: it is swept first."""
    assert location is not None  # only a plan with deadLetterPath or deadLetterTopic isolates records
    sink = dead_letter_sink(location, query_id)
    sink.sweep(record.epoch)
    handles = {}
    for region, letter in sorted(record.dead_lettered.items()):
        outcome = outcomes[region]
        # A set proven together (suspectsTogether): the suspect, then its members, each with its own error.
        letters = [(letter.offset, outcome.dead_letter, letter.error)] + [
            (m.offset, m.dead_letter, letter.member_error(m.reason or UNKNOWN_CAUSE))
            for m in outcome.members[:letter.count - 1]]
        if [o for o, _d, _e in letters] != list(range(letter.offset, letter.offset + letter.count)):
            raise RegionalPlanError(f"epoch {record.epoch}: region {region!r} dead-letters offsets "
                                    f"[{letter.offset}, {letter.offset + letter.count}) but its tasks read others")
        rows = pa.concat_tables([dead_letter_rows(payload or b"", region, offset, record.epoch, error)
                                 for offset, payload, error in letters])
        handles[region] = sink.prepare(record.epoch, region, iter(rows.to_batches()))
    return handles


def finish(intent: Intent, store: EpochStore, target: Target[Any], dead_letter_sink: DeadLetterSink,
           retain_epochs: int | None) -> EpochRecord:
    """Steps 5 to 8 of a decided epoch; a re-run repeats them safely (each target acts once)."""
    record = intent.record
    epoch = record.epoch
    failpoints.reach("before_publish", epoch)

    # 5. Publish the dead letters (atomic and idempotent in their sink).
    if intent.dead_letters:
        # Where the intent says, not where the options say now: a renamed topic or path takes the next epochs'.
        place = dead_letter_place(intent.dead_letter_path, intent.dead_letter_topic)
        if place is None:
            raise RegionalStoreError(f"the intent of epoch {epoch} holds dead letters but no deadLetterPath or "
                                     "deadLetterTopic: the store was damaged. Restore it, or start a new "
                                     "checkpointLocation")
        failpoints.reach("before_dead_letters", epoch)
        dead_letter_sink(place, store_query_id(store, epoch)).commit(epoch, intent.dead_letters)
        failpoints.reach("after_dead_letters", epoch)

    # 6. Publish the committed regions' slices (atomic and idempotent in the target); discard the rest.
    report = EpochReport.of(record)
    if record.committed:
        target.commit(epoch, intent.publish, report=report)
    failpoints.reach("before_record", epoch)
    if intent.discard:
        target.abort(epoch, intent.discard)

    # 7. Record the epoch: the store's state now includes it. Then clean up.
    store.write_record(record)
    if retain_epochs is not None:
        store.prune(retain_epochs, latest=record)
    if epoch % SWEEP_EVERY_EPOCHS == 0:
        target.sweep(epoch)
    if log.isEnabledFor(logging.INFO):  # describe() reads every region: not for a line nobody logs (10,000 regions)
        log.info("regional: %s", describe(record))

    # 8. Tell the target, region by region.
    notify(target, record, report)
    return record


def abort_epoch(store: EpochStore, target: Target[Any], epoch: int, handles: dict[str, Any]) -> None:
    """Spark aborted the epoch: its tasks failed for good, or phase two raised (Spark calls abort after a failed
    commit). Discard what the tasks staged, unless the epoch was decided: then its intent owns the handles (some
    may be published already) and the next start finishes it as decided. A store that cannot be read keeps
    them too: a staged slice left behind is cleaned later, a published one deleted is a lost record."""
    if not handles:
        return
    try:
        decided = store.read_intent(epoch) is not None or store.read_record(epoch) is not None
    except Exception as exc:  # the store is unreachable (the reason phase two failed, perhaps)
        log.warning("regional: epoch %d was aborted and its store cannot be read (%s); its staged output is kept",
                    epoch, exc)
        return
    if decided:
        log.warning("regional: epoch %d failed after its decision; the next start finishes it as decided", epoch)
        return
    target.abort(epoch, handles)


def store_query_id(store: EpochStore, epoch: int) -> str:
    query_id = store.query_id()
    if query_id is None:
        raise RegionalStoreError(f"epoch {epoch}: the regional store has no query id: it was damaged. Restore it, "
                                 "or " + NEW_QUERY)
    return query_id


def notify(target: Target[Any], record: EpochRecord, report: EpochReport | None = None) -> None:
    """Region-level notification (FLIP-600's partially completed checkpoint)."""
    report = report or EpochReport.of(record)
    target.on_epoch(record.epoch, report.committed, report.fallen_back)


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


def _require_json_handles(epoch: int, intent: Intent, target: Target[Any]) -> None:
    try:
        json.dumps({"publish": intent.publish, "discard": intent.discard})
    except (TypeError, ValueError) as exc:
        target.abort(epoch, {**intent.publish, **intent.discard})
        raise RegionalConfigError(
            f"the target's prepare() returned a handle that is not JSON-serialisable ({exc}); handles go into "
            "the store's write-ahead intent: return str, int, float, bool, None, lists or dicts of them"
        ) from None

