"""The ``regional`` data source: one Spark input partition per region, planned from the store.

Every known region gets its partition in every epoch, in region-id order (an
empty range included), so that sink task ``i`` receives exactly region ``i``
of the plan. Each range starts at the region's committed offset.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from regional.config import RegionalPolicy, merge_options, parse_optional_int, policy_for_plan, shared_options
from regional.errors import RegionalConfigError, RegionalStoreError
from regional.inputs import SCHEMA_DDL, make_input
from regional.plan import EpochPlan, RegionCursor, initial_offset, plan_epoch
from regional.region_timeout import TIMED_BATCH_ROWS, SinkWatch
from regional.store import Store

log = logging.getLogger("regional")


class RegionalDataSource(DataSource):
    """``spark.readStream.format("regional")`` and ``df.writeStream.format("regional")``.

    ``register()`` builds a subclass whose ``conf_defaults`` carry the session's
    ``spark.regional.*`` conf to the Python workers.
    """

    conf_defaults: ClassVar[dict[str, str]] = {}

    @classmethod
    def name(cls) -> str:
        return "regional"

    def schema(self) -> str:
        return SCHEMA_DDL

    def merged_options(self) -> dict[str, str]:
        return merge_options(self.conf_defaults, self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RegionalStreamReader(self.merged_options())

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from regional.sink import RegionalStreamWriter

        return RegionalStreamWriter(self.merged_options(), schema, shared_options(self.options))


@dataclass
class RegionPartition(InputPartition):
    epoch: int
    index: int
    region: str
    start: int
    end: int
    split: Any


class RegionalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        checkpoint = options.get("checkpointlocation")
        if not checkpoint:
            raise RegionalConfigError(
                "the regional source needs the query's checkpoint location to find its store. With regional's "
                "JVM shim loaded (see regional.register's warning), it takes writeStream's; without it, add "
                ".option('checkpointLocation', <the same path as on writeStream>) to readStream"
            )
        self.options = dict(options)
        self.store = Store(checkpoint)
        self.input = make_input(options)
        self.max_records = parse_optional_int(options, "maxRecordsPerRegion", minimum=1)
        RegionalPolicy.from_options(options)  # bad settings fail at start, not in a task
        self.available_now: dict[str, int] | None = None  # Trigger.AvailableNow: read up to here, then end
        self.started_at = time.time()

    def prepareForTriggerAvailableNow(self) -> None:
        latest = self.store.latest_record()
        self.available_now = self.input.available(latest.epoch + 1 if latest else 0)

    def initialOffset(self) -> dict[str, Any]:
        return initial_offset(str(self.store.checkpoint))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        previous = EpochPlan.from_offset(start)
        epoch = previous.epoch + 1
        record = self.store.latest_record(before=epoch)
        if previous.epoch >= 0 and (record is None or record.epoch != previous.epoch):
            raise RegionalStoreError(
                f"Spark committed epoch {previous.epoch} but the regional store at {self.store.root} "
                f"{'has no record' if record is None else f'ends at epoch {record.epoch}'}: the store was "
                "removed or replaced. Restore it, or start the query on a new checkpointLocation"
            )
        stopping = self.store.final_epoch_requested_since(self.started_at)
        if stopping and record is not None and record.whole:
            return start  # a graceful stop got its final global epoch: start no other
        cursors = {r: RegionCursor(s.committed_offset, s.current_epoch)
                   for r, s in (record.regions.items() if record else ())}
        available = self.input.available(epoch)
        if self.available_now is not None:
            available = {r: min(n, self.available_now.get(r, 0)) for r, n in available.items()}
        plan = plan_epoch(epoch, str(self.store.checkpoint), cursors, available, self.max_records,
                          ends=self.available_now if self.available_now is not None else self.input.ends(),
                          force_reason="a graceful stop asked for a final global epoch" if stopping else None)
        if record is not None and record.fallen_back and plan.has_work:
            log.warning("regional: epoch %d retries %d fallen-back region(s): %s", epoch, len(record.fallen_back),
                        ", ".join(sorted(record.fallen_back)[:5]))
        # Nothing to read anywhere: hand Spark its own offset back, so no empty epoch runs
        # (and a bounded query, or Trigger.AvailableNow, ends).
        return plan.to_offset() if plan.has_work else start

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if start == end:
            return []
        plan = EpochPlan.from_offset(end)
        return [
            RegionPartition(plan.epoch, i, r.region, r.start, r.end,
                            self.input.split(r.region, r.start, r.end) if r.has_work else None)
            for i, r in enumerate(plan.regions)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RegionPartition)
        if partition.end <= partition.start:
            return
        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        # Settings given on writeStream reach the source through the store.
        options = {**self.options, **self.store.read_sink_options()}
        policy = policy_for_plan(RegionalPolicy.from_options(options), self.store.plan_allows_regional_epochs())
        if policy.enabled and attempt >= policy.region_attempts:
            # Quarantine: earlier attempts failed upstream of the sink. Read nothing, so that
            # this attempt succeeds and the epoch goes on without the region.
            log.warning("regional: epoch %d region %r quarantined at attempt %d", partition.epoch,
                        partition.region, attempt)
            return
        timeout = policy.region_timeout_s if policy.enabled else None
        if timeout is None:
            yield from self.input.read(partition.region, partition.start, partition.end, partition.split)
            return
        # regionTimeout: stop reading when time is up; what was emitted is published (a prefix),
        # the rest of the range moves to the next epoch (see region_timeout.py).
        sink = SinkWatch(self.store.sink_receiving_path(partition.epoch, partition.index, attempt), timeout)
        next_offset = partition.start
        for batch in self.input.read(partition.region, partition.start, partition.end, partition.split,
                                     batch_rows=TIMED_BATCH_ROWS):
            if next_offset > partition.start and sink.expired():
                self.store.write_cut(partition.epoch, partition.index, attempt, partition.region, next_offset)
                return
            yield batch
            next_offset += batch.num_rows

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the sink's store record, not Spark's commit, moves a region's offset."""
