"""The ``regional`` data source: one Spark input partition per region, planned from the store.

Every known region gets its partition in every epoch, in region-id order (an
empty range included), so that sink task ``i`` receives exactly region ``i``
of the plan. Each range starts at the region's committed offset.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

from regional.config import merge_options, parse_optional_int
from regional.errors import RegionalConfigError, RegionalStoreError
from regional.inputs import SCHEMA_DDL, make_input
from regional.plan import EpochPlan, RegionCursor, initial_offset, plan_epoch
from regional.store import Store


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

        return RegionalStreamWriter(self.merged_options(), schema)


@dataclass
class RegionPartition(InputPartition):
    index: int
    region: str
    start: int
    end: int
    split: Any


class RegionalStreamReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        checkpoint = options.get("checkpointlocation")
        if not checkpoint:
            raise RegionalConfigError(
                "the regional source needs the query's checkpoint location to find its store: add "
                ".option('checkpointLocation', <the same path as on writeStream>) to readStream"
            )
        self.store = Store(checkpoint)
        self.input = make_input(options)
        self.max_records = parse_optional_int(options, "maxRecordsPerRegion", minimum=1)

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
        cursors = {r: RegionCursor(s.committed_offset, s.current_epoch)
                   for r, s in (record.regions.items() if record else ())}
        plan = plan_epoch(epoch, str(self.store.checkpoint), cursors, self.input.available(epoch), self.max_records)
        # Nothing to read anywhere: hand Spark its own offset back, so no empty epoch runs.
        return plan.to_offset() if plan.has_work else start

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if start == end:
            return []
        plan = EpochPlan.from_offset(end)
        return [
            RegionPartition(i, r.region, r.start, r.end,
                            self.input.split(r.region, r.start, r.end) if r.has_work else None)
            for i, r in enumerate(plan.regions)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RegionPartition)
        if partition.end > partition.start:
            yield from self.input.read(partition.region, partition.start, partition.end, partition.split)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the sink's store record, not Spark's commit, moves a region's offset."""
