"""The ``regional`` sink: phase one in each task, phase two on the driver.

``write`` runs in the task of one region: it checks that the task holds exactly
one region in offset order, lets the committer stage the slice, and reports.
A failure of the committer becomes a ``failed`` report, not an exception, so
the epoch can go on without that region. ``commit`` hands everything to
``epoch.commit_epoch``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from regional.committers import MIXED_REGIONS, Committer, chain_first, load_committer
from regional.config import RegionalPolicy, parse_bool, policy_for_plan
from regional.decision import Status
from regional.epoch import TaskReport, commit_epoch
from regional.errors import RegionalConfigError, RegionalPlanError
from regional.region_timeout import mark_sink_receiving
from regional.spark_log import read_plan
from regional.store import Store

log = logging.getLogger("regional")

REGION_COLUMNS = ("region", "offset")


@dataclass
class RegionSliceMessage(WriterCommitMessage):
    report: TaskReport


class _Upstream(Exception):
    """Raised through the committer when the rows themselves fail (a UDF, the source,
    a plan check): that is not the committer's failure and must fail the task."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(repr(original))
        self.original = original


class SliceGuard:
    """Watches the rows of one task on their way to the committer."""

    def __init__(self, partition: int, keep_region_columns: bool, on_first_rows: Path | None = None,
                 mixed: bool = False) -> None:
        self.partition = partition
        self.keep = keep_region_columns
        self.mixed = mixed  # an all-or-nothing query whose plan moves rows between tasks
        self.region_rows: dict[str, int] = {}  # in a mixed task: rows per region
        self.on_first_rows = on_first_rows  # regionTimeout: the marker that starts the source's clock
        self.region: str | None = None
        self.first_offset: int | None = None
        self.last_offset: int | None = None
        self.rows = 0
        self.error: _Upstream | None = None

    def batches(self, upstream: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        while True:
            try:
                batch = next(upstream)
                if batch.num_rows == 0:
                    continue
                self._check(batch)
            except StopIteration:
                return
            except BaseException as exc:
                self.error = _Upstream(exc)
                raise self.error from None
            yield batch if self.keep else batch.drop_columns(list(REGION_COLUMNS))

    def _check(self, batch: pa.RecordBatch) -> None:
        regions = batch.column("region")
        if self.mixed:
            if regions.null_count:
                raise RegionalPlanError("a row reached the regional sink with a null 'region'")
            for item in pc.value_counts(regions).to_pylist():
                self.region_rows[item["values"]] = self.region_rows.get(item["values"], 0) + item["counts"]
            self.rows += batch.num_rows
            return
        if self.region is None:
            self.region = regions[0].as_py()
            if self.region is None:
                raise RegionalPlanError("a row reached the regional sink with a null 'region'")
        if regions.null_count or not pc.all(pc.equal(regions, self.region)).as_py():
            others = sorted({r for r in pc.unique(regions).to_pylist() if r != self.region}, key=str)[:3]
            raise RegionalPlanError(
                f"sink task {self.partition} received rows of region {self.region!r} and of {others}: "
                "an operator between the regional source and sink (repartition, coalesce, join with a shuffle) "
                "mixes regions. Remove it, or set spark.regional.enabled=false"
            )
        offsets = batch.column("offset").to_numpy(zero_copy_only=False)
        previous = self.last_offset if self.last_offset is not None else -1
        if offsets[0] <= previous or (len(offsets) > 1 and not np.all(offsets[1:] > offsets[:-1])):
            raise RegionalPlanError(
                f"sink task {self.partition}: region {self.region!r} arrived out of offset order; "
                "an operator between the regional source and sink reorders rows (sort, shuffle). Remove it"
            )
        if self.first_offset is None:
            self.first_offset = int(offsets[0])
            if self.on_first_rows is not None:
                mark_sink_receiving(self.on_first_rows)
        self.last_offset = int(offsets[-1])
        self.rows += len(offsets)


class RegionalStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType,
                 own_options: Mapping[str, str] | None = None) -> None:
        missing = [c for c in REGION_COLUMNS if c not in schema.fieldNames()]
        if missing:
            raise RegionalConfigError(
                f"the regional sink needs the columns 'region' and 'offset' of the regional source, "
                f"and the query drops {missing}: keep them in your select(...) (they are not written to "
                "the target unless keepRegionColumns=true)"
            )
        checkpoint = options.get("checkpointlocation")
        if not checkpoint:
            raise RegionalConfigError("the regional sink needs .option('checkpointLocation', ...) on writeStream")
        self.options = dict(options)
        self.checkpoint = checkpoint
        # The JVM shim's plan check at query start: a plan that mixes regions runs all-or-nothing.
        self.mixed = not Store(checkpoint).plan_allows_regional_epochs()
        self.policy = policy_for_plan(RegionalPolicy.from_options(options), not self.mixed)
        self.keep_region_columns = parse_bool(options, "keepRegionColumns", default="false")
        load_committer(options.get("target"), self.options)  # fail at start on a bad target
        # Regional settings given on writeStream also rule the source's tasks (quarantine, timeout).
        Store(checkpoint).write_sink_options(own_options or {})

    def _committer(self) -> Committer:
        return load_committer(self.options.get("target"), self.options)

    # -- phase one, in the task ------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RegionSliceMessage:
        ctx = TaskContext.get()
        assert ctx is not None, "write() runs in a Spark task"
        partition, attempt = ctx.partitionId(), ctx.attemptNumber()
        epoch = int(ctx.getLocalProperty("streaming.sql.batchId") or -1)
        marker = None
        if self.policy.enabled and self.policy.region_timeout_s is not None:
            marker = Store(self.checkpoint).sink_receiving_path(epoch, partition, attempt)
        guard = SliceGuard(partition, self.keep_region_columns, marker, self.mixed)
        batches = guard.batches(iterator)
        try:
            first = next(batches, None)
        except _Upstream as up:
            raise up.original from None
        if first is None:
            if self.policy.enabled and attempt >= self.policy.region_attempts:
                # The source read nothing for this attempt: the region is quarantined (see source.read).
                reason = f"quarantined: {attempt} attempts failed upstream of the sink"
                return RegionSliceMessage(TaskReport(partition, attempt, Status.QUARANTINED, reason=reason))
            return RegionSliceMessage(TaskReport(partition, attempt, Status.WRITTEN))
        label = MIXED_REGIONS if self.mixed else guard.region
        assert label is not None
        try:
            handle = self._committer().prepare(epoch, label, chain_first(first, batches))
            leftover = sum(b.num_rows for b in batches)  # rows the committer did not take
        except _Upstream as up:
            raise up.original from None
        except Exception as exc:
            if guard.error is not None:
                raise guard.error.original from None
            if not self.policy.enabled:
                raise  # all-or-nothing: the target's error fails the query, as in plain Spark
            return self._failed(partition, attempt, guard, exc, epoch)
        if guard.error is not None:  # the committer swallowed an upstream failure
            raise guard.error.original from None
        if leftover:
            exc = RuntimeError(f"committer returned from prepare() with {leftover} rows not consumed")
            if not self.policy.enabled:
                raise exc
            return self._failed(partition, attempt, guard, exc, epoch, handle)
        return RegionSliceMessage(TaskReport(partition, attempt, Status.WRITTEN, guard.region,
                                             guard.first_offset, guard.last_offset, guard.rows, handle,
                                             region_rows=guard.region_rows or None))

    def _failed(self, partition: int, attempt: int, guard: SliceGuard, exc: BaseException,
                epoch: int, handle: Any = None) -> RegionSliceMessage:
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:500]
        log.warning("regional: epoch %d region %r failed in the target: %s", epoch, guard.region, reason)
        return RegionSliceMessage(TaskReport(partition, attempt, Status.FAILED, guard.region,
                                             guard.first_offset, guard.last_offset, guard.rows, handle, reason))

    # -- phase two, on the driver ------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        store = Store(self.checkpoint)
        plan = read_plan(store.checkpoint, batchId)
        if plan.epoch != batchId:
            raise RegionalPlanError(f"Spark's batch {batchId} carries the regional plan of epoch {plan.epoch}")
        reports = [m.report if isinstance(m, RegionSliceMessage) else None for m in messages]
        commit_epoch(plan, reports, store, self._committer(), self.policy, mixed=self.mixed)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        handles = {f"{m.report.partition}": m.report.handle for m in messages
                   if isinstance(m, RegionSliceMessage) and m.report.handle is not None}
        if handles:
            self._committer().abort(batchId, handles)

