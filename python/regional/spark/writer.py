"""The regional sink: stage in each task (phase one), decide and publish on the driver (phase two).

``write`` runs in the task of one region: it checks that the task holds one region in offset order,
lets the target stage the slice, and returns a commit message that says what the source read (its
read receipt), what reached the target, and the outcome. A failure of the target becomes a ``failed``
outcome, not an exception, so the epoch goes on without the region. ``commit`` hands the messages to the
phase-two coordinator (``regional.coordinator``), the only caller of the target on the driver.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from regional import failpoints
from regional.coordinator import abort_epoch, commit_epoch, ready_target
from regional.errors import RegionalConfigError, RegionalPlanError
from regional.inputs import load_input
from regional.inputs.base import AcknowledgingInput, StoredInput
from regional.location import optional_location_text
from regional.options import SPARK_WRITE, Option, OptionTable, check_given, declared_by
from regional.protocol.decide import Outcome, TaskOutcome
from regional.protocol.settings import SETTINGS_OPTIONS, conf_settings, given_settings, parse_bool
from regional.spark.offset_log import read_plan
from regional.spark.status_publisher import PUBLISHER
from regional.spark.task_files import TaskFiles, TaskKey
from regional.spark.worker_process import freeze_imports, quiet_after_cut_input
from regional.storage import open_storage
from regional.store import Store
from regional.targets import dead_letter_place, dead_letter_target, load_target
from regional.targets.base import MIXED_REGIONS, QUERY_ID_OPTION, RowsRejected, Target, chain_first
from regional.targets.kafka_topic import DEAD_LETTER_TOPIC_OPTIONS

log = logging.getLogger("regional")

# The columns every regional source adds and the sink needs in its input (not written unless keepRegionColumns).
SOURCE_COLUMNS = ("region", "offset")


@dataclass
class RegionalCommitMessage(WriterCommitMessage):
    outcome: TaskOutcome


class _Upstream(Exception):
    """Raised through the target when the rows themselves fail (a UDF, the source, a plan check):
    that is not the target's failure and must fail the task."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(repr(original))
        self.original = original


class SliceGuard:
    """Watches the rows of one task on their way to the target."""

    def __init__(self, partition: int, keep_region_columns: bool, on_first_rows: Callable[[], None] | None = None,
                 mixed: bool = False) -> None:
        self.partition = partition
        self.keep = keep_region_columns
        self.mixed = mixed  # an all-or-nothing query whose plan moves rows between tasks
        self.region_rows: dict[str, int] = {}  # in a mixed task: rows per region
        self.on_first_rows = on_first_rows
        self.region: str | None = None
        self.first_offset: int | None = None
        self.last_offset: int | None = None
        self.rows = 0
        self.error: _Upstream | None = None
        # The rows broke the sink's own contract (regions mixed, offsets out of order, a null region): the query
        # is wrong, not the records. Never an upstream failure (it would quarantine and dead-letter healthy rows).
        self.violation: str | None = None

    def batches(self, upstream: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        while True:
            try:
                batch = next(upstream)
                if batch.num_rows == 0:
                    continue
                self._check(batch)
            except StopIteration:
                return
            except RegionalPlanError as exc:
                self.violation = str(exc)
                return  # the target stages nothing more; the driver fails the query with this message
            except BaseException as exc:
                quiet_after_cut_input()  # the task fails; its real error is another operator's
                self.error = _Upstream(exc)
                raise self.error from None
            yield batch if self.keep else batch.drop_columns(list(SOURCE_COLUMNS))

    def _check(self, batch: pa.RecordBatch) -> None:
        regions = batch.column("region")
        if regions.null_count:
            raise RegionalPlanError("a row reached the regional sink with a null 'region'")
        if self.mixed:
            for item in pc.value_counts(regions).to_pylist():
                self.region_rows[item["values"]] = self.region_rows.get(item["values"], 0) + item["counts"]
            self.rows += batch.num_rows
            return
        if self.region is None:
            self.region = regions[0].as_py()
        if not pc.all(pc.equal(regions, self.region)).as_py():
            others = sorted({r for r in pc.unique(regions).to_pylist() if r != self.region}, key=str)[:3]
            raise RegionalPlanError(
                f"sink task {self.partition} received rows of region {self.region!r} and of {others}: "
                "an operator between the regional source and sink (repartition, coalesce, join with a shuffle) "
                "mixes regions. Remove it, or set spark.regional.enabled=false"
            )
        # Offsets never go down. Several rows of one offset (explode, flatMap) or none (filter) are normal input.
        offsets = batch.column("offset").to_numpy(zero_copy_only=False)
        previous = self.last_offset if self.last_offset is not None else -1
        if offsets[0] < previous or (len(offsets) > 1 and not np.all(offsets[1:] >= offsets[:-1])):
            raise RegionalPlanError(
                f"sink task {self.partition}: region {self.region!r} arrived out of offset order; "
                "an operator between the regional source and sink reorders rows (sort, shuffle). Remove it"
            )
        if self.first_offset is None:
            self.first_offset = int(offsets[0])
            if self.on_first_rows is not None:
                self.on_first_rows()
        self.last_offset = int(offsets[-1])
        self.rows += len(offsets)


def drain(batches: Iterator[pa.RecordBatch]) -> None:
    """Take the rest of a failed region's input. Spark moves it through the task's operators whether the sink
    takes it or not (measured on 4.2), but a Python worker that returns with input left unread is not reused:
    the next task forks and imports a new one, every epoch (measured: a query whose only region with work
    fails ran 56 epochs a minute, 190 once drained). An upstream failure on the way still fails the task, as
    it would have anyway."""
    try:
        for _batch in batches:
            pass
    except _Upstream as up:
        raise up.original from None


def check_dead_letter_path(dead_letter_path: str | None, target: Target[Any]) -> None:
    """Dead letters go to a table of their own, never into the target's."""
    if dead_letter_path and target.location() == dead_letter_path:
        raise RegionalConfigError(f"deadLetterPath={dead_letter_path} is the target table itself: give the dead "
                                  "letters a Delta table of their own (their columns differ: epoch, error)")


_CHECKED_TOPIC_SINKS: set[int] = set()  # hashes of sink settings already checked in this process (a writer per epoch)


def check_dead_letter_topic(topic: str, query_id: str, options: Mapping[str, str],
                            regions: Sequence[str] = ()) -> None:
    """``deadLetterTopic`` needs its producer's settings on writeStream (``deadLetter.kafka.*``), valid ones; and
    a query that reads its own dead-letter topic would dead-letter its poison records again and again."""
    own = re.compile(re.escape(topic) + r"-[0-9]+")
    looped = sorted(r for r in regions if own.fullmatch(r))
    if looped:
        raise RegionalConfigError(f"deadLetterTopic={topic} is read by this query itself (regions {looped[:3]}): "
                                  "each dead letter would be read and dead-lettered again. Give the dead letters a "
                                  "topic the query does not subscribe to")
    key = hash((topic, query_id, tuple(sorted((k, v) for k, v in options.items() if k.startswith("deadletter.")))))
    if key in _CHECKED_TOPIC_SINKS:
        return
    sink = dead_letter_target(dead_letter_place(None, topic) or "", query_id, options)
    check = getattr(sink, "check", None)
    if check is not None:
        check()
    _CHECKED_TOPIC_SINKS.add(key)


# What writeStream takes besides its target's own options and regional's settings.
WRITE_OPTIONS = OptionTable("the regional sink", [
    Option("target", "required", "`delta`, `postgres`, `kafka` or `python:<module>:<Class>`."),
    Option("keepRegionColumns", "false", "Write the `region` and `offset` columns to the target too."),
])


def check_write_options(options: Mapping[str, str], columns: Sequence[str] | None, conf: Mapping[str, str]) -> None:
    """writeStream's options, checked at ``start()`` (``regional.spark.start_check``), before the query starts,
    without the store or the outside world; the writer makes the same checks for every epoch. ``options``:
    case-insensitive, as Spark gives them; ``columns``: the query's, where known. A user's ``python:`` target is
    not built here, in the script's process: its options are checked at the first epoch."""
    _check_columns_and_checkpoint(options, columns)
    if str(options.get("target", "")).startswith("python:"):
        return
    target = load_target({**{k.lower(): str(v) for k, v in options.items()}, QUERY_ID_OPTION: "start-check"})
    _check_target_options(options, conf, target)


def _check_columns_and_checkpoint(options: Mapping[str, str], columns: Sequence[str] | None) -> None:
    missing = [c for c in SOURCE_COLUMNS if columns is not None and c not in columns]
    if missing:
        raise RegionalConfigError(
            f"the regional sink needs the columns 'region' and 'offset' of the regional source, "
            f"and the query drops {missing}: keep them in your select(...) (they are not written to "
            "the target unless keepRegionColumns=true)"
        )
    if not options.get("checkpointlocation"):
        raise RegionalConfigError("the regional sink needs .option('checkpointLocation', ...) on writeStream")
    parse_bool(options, "keepRegionColumns", default="false")


def _check_target_options(options: Mapping[str, str], conf: Mapping[str, str], target: Target[Any]) -> None:
    declared = declared_by(target)
    if declared is not None:  # a typo must not pass for a setting
        check_given("writeStream", options, [declared, WRITE_OPTIONS, SETTINGS_OPTIONS, DEAD_LETTER_TOPIC_OPTIONS,
                                             SPARK_WRITE])
    # readStream's options may set it too: commit checks the resolved value again.
    seen = {**conf_settings(conf), **given_settings(options)}
    check_dead_letter_path(optional_location_text("deadLetterPath", seen.get("deadLetterPath", "")), target)


class RegionalStreamWriter(DataSourceStreamArrowWriter):
    """Built on the driver for every epoch (and pickled into its tasks)."""

    def __init__(self, conf: Mapping[str, str], options: Mapping[str, str], schema: StructType) -> None:
        _check_columns_and_checkpoint(options, schema.fieldNames())  # as start() did (check_write_options)
        store = Store(options["checkpointlocation"])
        self.checkpoint = str(store.checkpoint)
        self.query_id = store.open_query()
        # The JVM shim's plan check at query start: a plan that moves rows between tasks runs all-or-nothing,
        # and its sink tasks hold rows of many regions.
        self.mixed = not store.plan_allows_regional_epochs()
        self.keep_region_columns = parse_bool(options, "keepRegionColumns", default="false")
        self.target_options = {**{k.lower(): str(v) for k, v in options.items()}, QUERY_ID_OPTION: self.query_id}
        target = load_target(self.target_options)
        _check_target_options(options, conf, target)
        seen = {**conf_settings(conf), **given_settings(options)}
        if seen.get("deadLetterTopic", "").strip():  # its producer's settings fail at start, not at a dead letter
            check_dead_letter_topic(seen["deadLetterTopic"].strip(), self.query_id, self.target_options)
        # A bad target fails at start, not in a task; an interrupted epoch is finished before new tasks run.
        ready_target(store, target, self._target_schema(schema), self._dead_letter_sink)
        self.target_options.update(target.task_options())  # what open() found that the tasks' copies need
        given = given_settings(options)
        recorded = store.read_write_options()
        if recorded is None:  # the source refuses to plan without them: this records them for the next start
            store.record_write_options(f"writer-{uuid.uuid4()}", given)
        elif recorded != given:
            # The source planned this run with settings from an earlier run (this run's start was not recorded):
            # record them for the next run, and stop this one before it publishes anything under the old ones.
            store.record_write_options(f"writer-{uuid.uuid4()}", given)
            raise RegionalConfigError(
                f"writeStream's regional settings {given} were not recorded when this run started, and the source "
                f"planned with an earlier run's {recorded}: call regional.register(spark) before starting the "
                "query (over Spark Connect: the server needs the JVM shim). They are recorded now; start the query "
                "again")

    def _target_schema(self, schema: StructType) -> pa.Schema:
        """The Arrow schema of the rows ``prepare`` receives."""
        from pyspark.sql.pandas.types import to_arrow_schema

        kept = StructType([f for f in schema.fields if self.keep_region_columns or f.name not in SOURCE_COLUMNS])
        return to_arrow_schema(kept, timezone="UTC")

    def _target(self) -> Target[Any]:
        return load_target(self.target_options)

    def _dead_letter_sink(self, location: str, query_id: str) -> Target[Any]:
        """The coordinator's dead-letter sink factory: a topic's producer takes the sink's ``deadLetter.kafka.*``."""
        return dead_letter_target(location, query_id, self.target_options)

    # -- phase one, in the task ------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RegionalCommitMessage:
        freeze_imports()
        key = TaskKey.current()
        files = TaskFiles(key)
        guard = SliceGuard(key.partition, self.keep_region_columns, files.mark_receiving, self.mixed)
        batches = guard.batches(iterator)
        try:
            first = next(batches, None)
        except _Upstream as up:
            raise up.original from None
        if guard.violation is not None:
            return RegionalCommitMessage(self._violated(key, files, guard, iterator, None))
        if first is None:
            return RegionalCommitMessage(self._outcome(key, files, guard, None))
        label = MIXED_REGIONS if self.mixed else guard.region
        assert label is not None
        # A probe's rows (records beside an isolated one, some published already, never published by it) go to
        # ``Target.probe``. The source wrote its receipt before its first rows left it.
        receipt = files.read_receipt()
        probing = receipt is not None and receipt.probe
        try:
            target = self._target()
            handle = (target.probe if probing else target.prepare)(key.epoch, label, chain_first(first, batches))
            leftover = sum(b.num_rows for b in batches)  # rows the target did not take
            failpoints.reach("staged", key.epoch)
        except _Upstream as up:
            raise up.original from None
        except RowsRejected:
            raise  # the rows' failure, as a UDF's would be: Spark retries, then the region is quarantined (isolated)
        except Exception as exc:
            if guard.error is not None:
                raise guard.error.original from None
            if not self._regional(files):
                raise  # all-or-nothing: the target's error fails the query, as in plain Spark
            drain(batches)
            return RegionalCommitMessage(self._failed(key, files, guard, exc))
        if guard.error is not None:  # the target swallowed an upstream failure
            raise guard.error.original from None
        if guard.violation is not None:
            return RegionalCommitMessage(self._violated(key, files, guard, iterator, handle))
        if leftover:
            unconsumed = RuntimeError(f"the target returned from prepare() with {leftover} rows not consumed")
            if not self._regional(files):
                raise unconsumed
            return RegionalCommitMessage(self._failed(key, files, guard, unconsumed, handle))
        return RegionalCommitMessage(self._outcome(key, files, guard, handle))

    def _regional(self, files: TaskFiles) -> bool:
        """Whether a target failure fails only this region (the plan's settings.enabled, from the receipt)."""
        receipt = files.read_receipt()
        return not self.mixed and (receipt is None or receipt.enabled)

    def _outcome(self, key: TaskKey, files: TaskFiles, guard: SliceGuard, handle: Any) -> TaskOutcome:
        """What the source read (its receipt) and what the target staged, as one explicit outcome."""
        if self.mixed:
            return TaskOutcome(key.partition, key.attempt, Outcome.WRITTEN, self.query_id, rows=guard.rows,
                               handle=handle, region_rows=guard.region_rows)
        receipt = files.read_receipt()
        dead_letter = files.read_dead_letter()
        files.remove()
        base = TaskOutcome(key.partition, key.attempt, Outcome.MISSING, handle=handle, rows=guard.rows,
                           region=guard.region, first_offset=guard.first_offset, last_offset=guard.last_offset)
        if receipt is None or receipt.end is None:
            return replace(base, reason="no finished read receipt from this task's source (its worker died, or an "
                                      "operator between source and sink moved rows between tasks)")
        region = guard.region or receipt.region
        if receipt.quarantined:
            if guard.rows:
                return replace(base, reason="the source quarantined the region but rows reached the sink")
            return replace(base, status=Outcome.QUARANTINED, query_id=receipt.query_id, region=region,
                           start=receipt.start, end=receipt.start, dead_letter=dead_letter,
                           reason=f"quarantined: {key.attempt} attempts failed upstream of the sink")
        return replace(base, status=Outcome.WRITTEN, query_id=receipt.query_id, region=region, start=receipt.start,
                       end=receipt.end, seconds=max(time.time() - receipt.started_at, 0.0))

    def _violated(self, key: TaskKey, files: TaskFiles, guard: SliceGuard, rest: Iterator[pa.RecordBatch],
                  handle: Any) -> TaskOutcome:
        """The rows broke the sink's contract: say so to the driver, which fails the query with it (and discards
        what was staged). The rest of the input is taken, so the Python worker is reused; an upstream failure
        on the way still fails the task."""
        for _batch in rest:
            pass
        files.remove()
        return TaskOutcome(key.partition, key.attempt, Outcome.FAILED, region=guard.region, rows=guard.rows,
                           handle=handle, reason=guard.violation, plan_error=guard.violation)

    def _failed(self, key: TaskKey, files: TaskFiles, guard: SliceGuard, exc: BaseException,
                handle: Any = None) -> TaskOutcome:
        files.remove()
        text = str(exc).strip()
        reason = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:500]
        log.warning("regional: epoch %d region %r failed in the target: %s", key.epoch, guard.region, reason)
        return TaskOutcome(key.partition, key.attempt, Outcome.FAILED, region=guard.region, rows=guard.rows,
                           first_offset=guard.first_offset, last_offset=guard.last_offset, handle=handle,
                           reason=reason)

    # -- phase two, on the driver ------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        freeze_imports()  # the sink runner's worker, too, is collected after every epoch (worker_process)
        store = Store(self.checkpoint)
        plan = read_plan(open_storage(store.checkpoint), batchId)
        if plan.epoch != batchId:
            raise RegionalPlanError(f"Spark's batch {batchId} carries the regional plan of epoch {plan.epoch}")
        target = self._target()
        check_dead_letter_path(plan.settings.dead_letter_path, target)
        if plan.settings.dead_letter_topic is not None:  # set on readStream only: checked before any decision
            check_dead_letter_topic(plan.settings.dead_letter_topic, self.query_id, self.target_options,
                                    [rr.region for rr in plan.regions])
        tasks = [m.outcome if isinstance(m, RegionalCommitMessage) else None for m in messages]
        record = commit_epoch(plan, tasks, store, target, self.mixed, self._dead_letter_sink)
        if plan.acknowledge:  # the source hears of the epoch now, before Spark ends it (the reader too, later)
            source = load_input(plan.acknowledge)
            if isinstance(source, StoredInput):
                source.use_store(store)
            if isinstance(source, AcknowledgingInput):
                source.on_recorded(record)
        PUBLISHER.request(self.checkpoint)  # the Spark UI tab's and the metrics' view, after the epoch

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        handles = {f"#{m.outcome.partition}": m.outcome.handle for m in messages
                   if isinstance(m, RegionalCommitMessage) and m.outcome.handle is not None}
        if handles:
            abort_epoch(Store(self.checkpoint), self._target(), batchId, handles)

