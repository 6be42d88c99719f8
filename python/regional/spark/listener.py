"""The StreamingQueryListener ``register`` adds.

- At query start (``onQueryStarted`` runs synchronously inside ``start()``, before the source
  plans epoch 0), it records writeStream's regional settings in the store, so that the driver
  resolves one set of settings from both sides; only when the JVM shim is not loaded, since the shim's
  listener does it where the query runs (the only way over Spark Connect). (Staged output an earlier run
  left is swept by the sink, ``coordinator.ready_target``, before epoch 0's tasks.)
- Per epoch, it logs one line (and one per dead letter) and keeps FLIP-600's two metrics; it ends a
  bounded query once everything is published.

It runs in the driver's Python process (py4j callback threads); over Spark Connect, pyspark 4.2 runs it in
the client's process, which must then reach the checkpoint for the per-epoch line and the bounded stop. It
learns a query's store from the plan in the progress event's end offset.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

from regional.errors import RegionalError
from regional.protocol.plan import EpochPlan
from regional.protocol.settings import given_settings
from regional.spark.console import regional_message, tell_once
from regional.store import Store
from regional.store.model import describe
from regional.store.status import Progress, status

log = logging.getLogger("regional")


class RegionalListener(StreamingQueryListener):
    def __init__(self, spark: SparkSession, record_settings: bool = True) -> None:
        self.session = spark  # not ``spark``: StreamingQueryListener has a property of that name
        self.record_settings = record_settings  # False when the JVM shim's listener records them
        self.metrics: dict[str, Progress] = {}  # per query id, as of the last epoch this listener heard of
        self._plan_checked: set[str] = set()  # runs whose plan check was reported
        self.closed = False  # set at interpreter exit: the py4j bridge is going away

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        if self.closed or not self.record_settings:
            return
        # Never fail Spark's listener bus: without the record, the source refuses to plan with a clear error.
        try:
            started = self._regional_query(str(event.id))
            if started is None:
                return
            store, options = started
            store.record_write_options(str(event.runId), given_settings(options))
        except Exception as exc:
            log.error("regional: could not record writeStream's settings of query %s at start: %s", event.id, exc)

    def _regional_query(self, query_id: str) -> tuple[Store, dict[str, str]] | None:
        """The store and writeStream options of a just-started query whose sink is regional."""
        query = self.session.streams.get(query_id)
        if query is None:
            return None
        execution = query._jsq.streamingQuery()  # internal API (Spark 4.2)
        try:
            if str(execution.sink().name()).lower() != "regional":
                return None
        except Exception:  # some sinks' tables (Delta's V1 wrapper) throw from name(): not regional
            return None
        return Store(str(execution.resolvedCheckpointRoot())), _write_options(execution)

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        """A query that stopped on an error: one line, regional's sentence when the error holds one (the script's
        excepthook does not say it again), else the error's first line. Spark's own "terminated with error" log and
        its traceback are off in sessions regional configures (log4j2.properties)."""
        if not event.exception:
            return
        message = regional_message(event.exception)
        if message is not None:
            tell_once(f"query {event.id} stopped: {message}", key=message)
            return
        first = next((line.strip() for line in str(event.exception).splitlines() if line.strip()), "")
        log.error("regional: query %s stopped with an error: %s (the whole error: query.exception(), or "
                  "REGIONAL_TRACEBACK=1 in the script)", event.id, first[:500])

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        if self.closed:
            return
        progress = event.progress
        plan = _regional_plan(progress.sources)
        if plan is None or plan.epoch != progress.batchId:
            return
        try:
            record = Store(plan.store).read_record(plan.epoch)
            self._report_plan_check(str(progress.runId), progress.name or str(progress.id), Store(plan.store))
        except RegionalError as exc:
            log.error("regional: query %s: %s", progress.id, exc)
            return
        if record is None:
            return
        try:
            self.metrics[str(progress.id)] = status(plan.store, epochs=1).progress()
        except RegionalError as exc:
            log.error("regional: query %s: %s", progress.id, exc)
        line = (f"regional: query {progress.name or progress.id} {describe(record)}; "
                f"quarantined {sum(f.quarantined for f in record.fallen_back.values())}; "
                f"oldest ref_epoch {record.oldest_ref_epoch}")
        (log.warning if record.fallen_back else log.info)(line)
        for region, letter in sorted(record.dead_lettered.items()):
            offsets = letter.offset if letter.count == 1 else f"{letter.offset} to {letter.offset + letter.count - 1}"
            log.warning("regional: query %s epoch %d: region %r offset %s dead-lettered to %s: %s",
                        progress.name or progress.id, record.epoch, region, offsets,
                        plan.settings.dead_letter_path or f"topic {plan.settings.dead_letter_topic}", letter.error)
        if plan.final and record.whole:
            # A bounded source is exhausted and everything it held is published: end the query.
            self._stop_later(str(progress.id), str(progress.runId))

    def _report_plan_check(self, run_id: str, query: str, store: Store) -> None:
        """Once per run: say that the JVM shim found an operator that turns regional epochs off."""
        if run_id in self._plan_checked:
            return
        self._plan_checked.add(run_id)
        check = store.read_query_plan()
        if check is not None and not check.regional_epochs:
            log.warning("regional: query %s: %s; regional epochs are off, every epoch is all-or-nothing. Remove "
                        "the %s to get regional epochs back", query, check.reason, check.operator)

    def _stop_later(self, query_id: str, run_id: str) -> None:
        """Stop the run that published everything, and only that run: the event can arrive after it ended, when
        the same query (same id, from the checkpoint) has been started again (a scheduled AvailableNow job)."""
        def stop() -> None:
            query = self.session.streams.get(query_id)
            if query is not None and query.isActive and str(query.runId) == run_id:
                log.info("regional: query %s read all of its bounded input; stopping it", query_id)
                query.stop()

        threading.Thread(target=stop, name=f"regional-stop-{query_id}", daemon=True).start()


def _write_options(execution: Any) -> dict[str, str]:
    """writeStream's options of a running query: ``MicroBatchExecution.extraOptions`` (private; Spark 4.2)."""
    cls = execution.getClass()
    while cls is not None:
        try:
            field = cls.getDeclaredField("extraOptions")
            break
        except Exception:
            cls = cls.getSuperclass()
    else:
        raise RegionalError("this Spark's streaming query has no extraOptions field: regional supports Spark 4.2")
    field.setAccessible(True)
    scala_map = field.get(execution)
    iterator = scala_map.iterator()
    options = {}
    while iterator.hasNext():
        pair = iterator.next()
        options[str(pair._1())] = str(pair._2())
    return options


def _regional_plan(sources: Any) -> EpochPlan | None:
    """The plan in a progress event's end offset: None when the query's source is not regional."""
    if len(sources) != 1:
        return None
    try:
        return EpochPlan.parse(sources[0].endOffset, "the progress event's end offset")
    except RegionalError:
        return None
