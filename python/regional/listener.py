"""The StreamingQueryListener ``register`` adds: one log line per regional epoch, the end of bounded queries.

It runs in the driver's Python process (py4j callback threads). It learns a
query's store from the plan in the progress event's end offset, so it needs no
handle on the query.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

from regional.epoch import describe
from regional.errors import RegionalError
from regional.plan import EpochPlan
from regional.store import Store

log = logging.getLogger("regional")


@dataclass
class QueryMetrics:
    """FLIP-600's two metrics, as of the last epoch this listener saw."""

    regional_epochs: int = 0
    oldest_ref_epoch: int | None = None
    last_epoch: int | None = None


class RegionalListener(StreamingQueryListener):
    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.metrics: dict[str, QueryMetrics] = {}
        self._plan_checked: set[str] = set()  # queries (run ids) whose plan check was reported

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        plan = _regional_plan(progress.sources)
        if plan is None or plan.epoch != progress.batchId:
            return
        try:
            record = Store(plan.store).read_record(plan.epoch)
        except RegionalError as exc:
            log.error("regional: query %s: %s", progress.id, exc)
            return
        self._report_plan_check(str(progress.runId), progress.name or str(progress.id), Store(plan.store))
        if record is None:
            return
        oldest = record.oldest_ref_epoch
        self.metrics[str(progress.id)] = QueryMetrics(record.regional_epochs, oldest, record.epoch)
        line = (f"regional: query {progress.name or progress.id} {describe(record)}; "
                f"quarantined {sum(f.quarantined for f in record.fallen_back.values())}; "
                f"oldest ref_epoch {oldest}")
        (log.warning if record.fallen_back else log.info)(line)
        if plan.final and record.whole:
            # A bounded source is exhausted and everything it held is published: end the query.
            self._stop_later(str(progress.id))

    def _report_plan_check(self, run_id: str, query: str, store: Store) -> None:
        """Once per run: say that the JVM shim found an operator that turns regional epochs off."""
        if run_id in self._plan_checked:
            return
        self._plan_checked.add(run_id)
        check = store.read_query_plan()
        if check is not None and not check.regional_epochs:
            log.warning("regional: query %s: %s; regional epochs are off, every epoch is all-or-nothing. Remove "
                        "the %s to get regional epochs back", query, check.reason, check.operator)

    def _stop_later(self, query_id: str) -> None:
        def stop() -> None:
            query = self.spark.streams.get(query_id)
            if query is not None and query.isActive:
                log.info("regional: query %s read all of its bounded input; stopping it", query_id)
                query.stop()

        threading.Thread(target=stop, name=f"regional-stop-{query_id}", daemon=True).start()


def _regional_plan(sources: Any) -> EpochPlan | None:
    if len(sources) != 1:
        return None
    try:
        offset = json.loads(sources[0].endOffset)
    except (TypeError, ValueError):
        return None
    if not isinstance(offset, dict) or "regions" not in offset or "store" not in offset:
        return None
    try:
        return EpochPlan.from_offset(offset)
    except RegionalError:
        return None
