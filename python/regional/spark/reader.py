"""The regional source: plans each epoch on the driver, reads one region per task.

Only regions with work get a Spark partition: partition i reads the plan's region i. Each range
starts at the region's committed offset. The plan (Spark's ``offsets/N``) carries the query id and
the resolved settings, and each partition carries what its task needs, so tasks never read the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from regional.dead_letters import encode_records
from regional.errors import NEW_QUERY, RegionalConfigError, RegionalDataLossError, RegionalStoreError
from regional.inputs import load_input
from regional.inputs.base import AcknowledgingInput, RegionInput, RetainedInput, StoredInput
from regional.options import SPARK_READ, Option, OptionTable, check_given, declared_by
from regional.protocol.decide import unproven_suspects
from regional.protocol.plan import (
    INITIAL_EPOCH,
    EpochPlan,
    RegionRange,
    Retention,
    initial_offset,
    plan_epoch,
    retry_due,
)
from regional.protocol.settings import SETTINGS_OPTIONS, Settings, parse_optional_int, resolve_settings
from regional.spark.offset_log import latest_logged_epoch
from regional.spark.status_publisher import PUBLISHER, enabled
from regional.spark.task_files import TIMED_BATCH_ROWS, ReadReceipt, SinkWatch, TaskFiles, TaskKey
from regional.spark.worker_process import freeze_imports
from regional.storage import open_storage
from regional.store import EpochRecord, RegionState, Standing, Store
from regional.store.model import OUTAGE_BACKOFF_MAX_S
from regional.targets import dead_letter_place, same_place

log = logging.getLogger("regional")

# getDefaultReadLimit's ReadMaxRows when only maxRecordsPerRegion limits reading: no total cap.
NO_TOTAL_LIMIT = 2**62
RETRY_WAIT_MAX_S = OUTAGE_BACKOFF_MAX_S  # the longest one plan waits for a retry before it hands Spark an empty epoch


# What readStream takes besides its source's own options and regional's settings.
READ_OPTIONS = OptionTable("the regional source", [
    Option("source", "required", "`files`, `kafka`, `deadLetters` or `generator`."),
    Option("checkpointLocation", "", "The query's checkpoint, as on writeStream: needed only without regional's JVM "
                                     "shim (which hands writeStream's to the source)."),
    Option("maxRecordsPerRegion", "", "At most this many records per region per epoch (admission control)."),
    Option("maxRecordsPerTrigger", "", "At most this many records per epoch over all regions."),
    Option("maxOffsetsPerTrigger", "", "`maxRecordsPerTrigger` under Kafka's name (offsets, counted as records)."),
])


def check_read_options(source: RegionInput[Any], options: Mapping[str, str]) -> None:
    """Refuse readStream options that neither the source nor regional declares (a typo must not pass for a
    setting), or that the source refuses. Called at ``.load()`` (the data source's schema) and again at start."""
    declared = declared_by(source)
    if declared is not None:  # a user's python: class may declare none
        check_given("readStream", options, [declared, READ_OPTIONS, SETTINGS_OPTIONS, SPARK_READ])


def trigger_limit(options: Mapping[str, str]) -> int | None:
    """``maxRecordsPerTrigger``, or Kafka's name for it, ``maxOffsetsPerTrigger`` (offsets, which Kafka
    counts like records: a range of n offsets holds at most n records)."""
    records = parse_optional_int(options, "maxRecordsPerTrigger", minimum=1)
    offsets = parse_optional_int(options, "maxOffsetsPerTrigger", minimum=1)
    if records is not None and offsets is not None and records != offsets:
        raise RegionalConfigError(f"maxRecordsPerTrigger={records} and maxOffsetsPerTrigger={offsets} are the same "
                                  "limit under two names: give one")
    return records if records is not None else offsets


@dataclass
class RegionPartition(InputPartition):
    """Partition ``index`` of an epoch: the plan's region ``index``, with what its task needs of the plan."""

    query_id: str
    epoch: int
    index: int
    range: RegionRange  # isolated: one suspect record, read for the dead letters by its quarantined attempt
    settings: Settings  # the plan's: enabled (quarantine and cuts apply), regionAttempts, regionTimeout
    split: Any  # what the input needs to read the range (``RegionInput.split``)
    probe: bool = False  # one of the plan's probes (``EpochPlan.probes``), not a region's range


class RegionalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, conf: Mapping[str, str], options: Mapping[str, str], schema: StructType | None = None) -> None:
        checkpoint = options.get("checkpointlocation")
        if not checkpoint:
            raise RegionalConfigError(
                "the regional source needs the query's checkpoint location to find its store. With regional's "
                "JVM shim loaded (see regional.register's warning), it takes writeStream's; without it, add "
                ".option('checkpointLocation', <the same path as on writeStream>) to readStream"
            )
        self.conf, self.options = dict(conf), dict(options)
        self.store = Store(checkpoint)
        self.input = load_input(options)
        check_read_options(self.input, options)
        if schema is not None:  # the columns fixed at .load() (the files source's partition columns)
            self.input.use_schema([(f.name, f.dataType.simpleString()) for f in schema.fields])
        if isinstance(self.input, StoredInput):  # e.g. the files source's manifest of files in arrival order
            self.input.use_store(self.store)
        self.max_per_region = parse_optional_int(options, "maxRecordsPerRegion", minimum=1)
        self.max_per_trigger = trigger_limit(options)
        resolve_settings(conf, options, {})  # a bad value fails at start, not in a task
        self.settings: Settings | None = None  # resolved once per run, at the first plan
        self.available_now: dict[str, int] | None = None  # Trigger.AvailableNow: read up to here, then end
        self.started_at = time.time()
        self.warned_lost: set[tuple[str, int]] = set()  # losses already logged in this run
        self.told_epoch = INITIAL_EPOCH  # the newest recorded epoch the input has heard of

    # -- planning, on the driver ----------------------------------------------------------------

    def resolved_settings(self) -> Settings:
        """Defaults, conf, readStream's and writeStream's options (recorded by the listener at query start)."""
        if self.settings is None:
            written = self.store.take_write_options()  # this run's record, or none: never an earlier run's
            if written is None:
                raise RegionalConfigError(
                    f"writeStream's regional settings were not recorded at query start in {self.store.root}: "
                    "call regional.register(spark) before starting the query (it adds the listener that records them; "
                    "where the JVM shim's listener could not record them, its warning in the driver's log says why)"
                )
            settings = resolve_settings(self.conf, self.options, written)
            source = self.input.table_location()
            place = dead_letter_place(settings.dead_letter_path, settings.dead_letter_topic)
            if source is not None and place is not None and same_place(place, source):
                raise RegionalConfigError(
                    f"the dead letters' place {place} is this query's own input: its dead letters would be read "
                    "again. Give the query its own dead-letter table or topic (a replay's records that fail again "
                    "go there)")
            if not self.store.plan_allows_regional_epochs():
                settings = settings.all_or_nothing()  # the JVM shim found an operator that mixes regions
            self.settings = settings
        return self.settings

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger is not None or self.max_per_region is not None:
            return ReadMaxRows(self.max_per_trigger or NO_TOTAL_LIMIT)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.store.fence()
        latest = self.store.latest_record()
        self._tell_input(latest)  # as before any plan: the source knows where each region is
        # Spark re-runs a logged plan it has not committed before it plans again: the epoch after that one.
        logged = latest_logged_epoch(open_storage(self.store.checkpoint))
        self.available_now = self.input.available(max(latest.epoch + 1 if latest else 0,
                                                      -1 if logged is None else logged + 1))

    # Every call from Spark's driver side takes the driver lock first: a restarted driver re-runs its last
    # planned epoch (``partitions``) before it plans a new one.
    def initialOffset(self) -> dict[str, Any]:
        self.store.fence()
        return initial_offset(self.store.open_query(), str(self.store.checkpoint))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self.store.fence()
        query_id = self.store.open_query()
        previous = int(start.get("epoch", INITIAL_EPOCH))
        if start.get("query_id") != query_id:
            raise RegionalStoreError(
                f"Spark's offset log belongs to regional query {start.get('query_id')} but the regional store at "
                f"{self.store.root} to query {query_id}: the store was removed or replaced. Restore it, or " + NEW_QUERY
            )
        epoch = previous + 1
        record = self.store.latest_record(before=epoch)
        if previous >= 0 and (record is None or record.epoch != previous):
            raise RegionalStoreError(
                f"Spark committed epoch {previous} but the regional store at {self.store.root} "
                f"{'has no record' if record is None else f'ends at epoch {record.epoch}'}: the store was "
                "removed or replaced. Restore it, or " + NEW_QUERY
            )
        self._tell_input(record)
        stopping = self.store.final_epoch_requested_since(self.started_at)
        if stopping and record is not None and record.whole:
            return start  # a graceful stop got its final global epoch: start no other
        if record is not None and not stopping:
            self._back_off(record)
        per_region, total = self._limits(limit)
        available = self.input.available(epoch)
        states = record.regions if record else {}
        first_offsets, retention = self._retention(states, available)
        self.store.record_latest_offsets(epoch, available,  # for the lag and headroom that status shows
                                         retention.log_starts if retention else None)
        if self.available_now is not None:
            available = {r: min(n, self.available_now.get(r, 0)) for r, n in available.items()}
        settings = self.resolved_settings()
        unproven_suspects(states, settings, self.started_at)  # onSuspectTimeout=fail: the query stops here
        acknowledge = self.input.phase_two_options() if isinstance(self.input, AcknowledgingInput) else None

        def plan_now() -> EpochPlan:
            return plan_epoch(epoch, query_id, str(self.store.checkpoint), states, available, settings, per_region,
                              total, ends=self.available_now if self.available_now is not None else self.input.ends(),
                              force_reason="a graceful stop asked for a final global epoch" if stopping else None,
                              first_offsets=first_offsets, retention=retention, now=time.time(),
                              sparse=self.input.sparse, acknowledge=acknowledge)

        plan = plan_now()
        # Only regions the source still has can wait (a region gone from it is never planned again).
        waiting = (self._retries_waiting({r: s for r, s in states.items() if r in available}, settings)
                   if not plan.regions and not stopping else None)
        if waiting is not None:
            self._wait_for_retry(waiting)
            plan = plan_now()
            if not plan.regions and waiting <= time.time():
                waiting = None  # due, yet not planned: it waits for nothing this source can give; no empty epoch
        for region, (gone_from, go_on) in sorted(plan.lost.items()):
            if (region, gone_from) not in self.warned_lost:
                self.warned_lost.add((region, gone_from))
                log.warning("regional: region %r: offsets %s are gone from the source; failOnDataLoss=false, so it "
                            "goes on from %d (recorded in the epoch record)", region,
                            f"[{gone_from}, {go_on})" if go_on > gone_from else f"from {gone_from} (its log was "
                            "replaced)", go_on)
        if record is not None and record.fallen_back and plan.regions:
            log.warning("regional: epoch %d retries %d fallen-back region(s): %s", epoch, len(record.fallen_back),
                        ", ".join(sorted(record.fallen_back)[:5]))
        # Nothing to read anywhere: hand Spark its own offset back, so no empty epoch runs (and a bounded
        # query, or Trigger.AvailableNow, ends). Except for a new query: Spark runs its batch 0 whatever the
        # source says, so epoch 0 is then an empty plan and Spark's batch ids stay the regional epochs.
        # A region waiting for a retry (deadLetterRetries) still has work: an empty epoch, not "nothing new", which
        # would end Trigger.AvailableNow and processAllAvailable with its record neither published nor dead-lettered.
        return plan.to_offset() if plan.regions or previous == INITIAL_EPOCH or waiting is not None else start

    @staticmethod
    def _retries_waiting(states: Mapping[str, RegionState], settings: Settings) -> float | None:
        """When the first region waiting for a retry of its isolated record is due; None when none waits."""
        if not (settings.enabled and settings.isolates):
            return None
        now = time.time()
        dues = [due for s in states.values() if (due := retry_due(s, settings, now)) is not None]
        return min(dues) if dues else None

    def _wait_for_retry(self, due: float) -> None:
        """Nothing else to read: wait for the first retry that is due, at most ``RETRY_WAIT_MAX_S`` at a time (Spark's
        stop waits for a source that is waiting); a graceful stop cuts it short."""
        deadline = time.monotonic() + min(due - time.time(), RETRY_WAIT_MAX_S)
        while time.monotonic() < deadline and not self.store.final_epoch_requested_since(self.started_at):
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))

    def _back_off(self, record: EpochRecord) -> None:
        """After epochs in which every region with work failed and nothing progressed (an outage), the next epoch
        waits: 1 s, doubling, capped (``EpochRecord.backoff_s``). A wait here, not "nothing new": Spark would take
        that for the end of the input (Trigger.AvailableNow, processAllAvailable). A graceful stop cuts it short."""
        deadline = time.monotonic() + record.recorded_at + record.backoff_s - time.time()
        while time.monotonic() < deadline and not self.store.final_epoch_requested_since(self.started_at):
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))

    def _retention(self, states: Mapping[str, RegionState],
                   available: Mapping[str, int]) -> tuple[dict[str, int], Retention | None]:
        """For a source that loses old records (Kafka): where new regions start, where logs begin now,
        and regions whose log is gone altogether (failOnDataLoss decides)."""
        source = self.input
        if not isinstance(source, RetainedInput):
            return {}, None
        first = self.store.starting_offsets(lambda: source.starting_offsets(available))
        log_starts = source.log_starts()
        gone = sorted(set(states) - set(log_starts))
        unselected = [r for r in gone if not source.selects(r)]  # the subscription changed between restarts
        pending = [r for r in unselected if states[r].state is not Standing.OK]
        if pending and source.fail_on_data_loss:
            raise RegionalConfigError(
                f"region(s) {', '.join(repr(r) for r in pending[:10])} are no longer selected by this query's "
                "options (the subscription changed) but have records not yet published (they fell back or are "
                "quarantined; see regional.status). Select them again until they are published, or set "
                "failOnDataLoss=false to drop them")
        gone = [r for r in gone if r not in unselected or r in pending]
        for region in unselected:
            if region not in pending and (region, -2) not in self.warned_lost:
                self.warned_lost.add((region, -2))
                log.info("regional: region %r is no longer selected by the query's options; it is not read any more "
                         "(everything read from it was published)", region)
        if gone and source.fail_on_data_loss:
            raise RegionalDataLossError(
                f"region(s) {', '.join(gone[:10])} are gone from the source (topic or partition deleted) with "
                "records possibly unread. With failOnDataLoss=true (the default) the query stops; set "
                "failOnDataLoss=false to go on without them")
        for region in gone:
            if (region, -1) not in self.warned_lost:
                self.warned_lost.add((region, -1))
                log.warning("regional: region %r is gone from the source (topic or partition deleted); "
                            "failOnDataLoss=false, so the query goes on without it", region)
        return first, Retention(log_starts, source.fail_on_data_loss, frozenset(source.replaced()))

    def _limits(self, limit: ReadLimit) -> tuple[int | None, int | None]:
        """Spark's read limit: ReadAllAvailable ignores the options' limits, as pyspark documents."""
        if isinstance(limit, ReadAllAvailable):
            return None, None
        if isinstance(limit, ReadMaxRows):
            return self.max_per_region, None if limit.max_rows >= NO_TOTAL_LIMIT else limit.max_rows
        raise RegionalConfigError(f"the regional source supports ReadAllAvailable and ReadMaxRows, not {limit}")

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self.store.fence()
        if start == end or end.get("epoch", INITIAL_EPOCH) == INITIAL_EPOCH:
            return []
        plan = EpochPlan.from_offset(end)
        if isinstance(self.input, StoredInput):
            self.input.before_splits(plan.epoch)
        return [RegionPartition(plan.query_id, plan.epoch, i, r, plan.settings,
                                self.input.split(r.region, r.start, r.end), i >= len(plan.regions))
                for i, r in enumerate(plan.ranges)]

    # -- reading, in the task -------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RegionPartition)
        freeze_imports()
        p, r, settings = partition, partition.range, partition.settings
        files = TaskFiles(TaskKey.current())
        files.remove_leftovers()
        started_at = time.time()

        def receipt(end: int | None, quarantined: bool = False) -> None:
            files.write_receipt(ReadReceipt(p.query_id, p.epoch, r.region, r.start, end, quarantined,
                                            settings.enabled, started_at, p.probe))

        if settings.enabled and files.key.attempt >= settings.region_attempts:
            # Quarantine: earlier attempts failed upstream of the sink. Read nothing, so that
            # this attempt succeeds and the epoch goes on without the region.
            log.warning("regional: epoch %d region %r quarantined at attempt %d", p.epoch, r.region,
                        files.key.attempt)
            if r.isolated:
                self._keep_dead_letter(p, files)
            receipt(r.start, quarantined=True)
            return
        receipt(None)
        timeout = settings.region_timeout_s if settings.enabled else None
        if timeout is None:
            yield from self.input.read(r.region, r.start, r.end, p.split)
            receipt(r.end)
            return
        # regionTimeout: stop reading when time is up; what was read is published (a prefix),
        # the rest of the range moves to the next epoch.
        watch = SinkWatch(files, timeout)
        next_offset = r.start
        for batch in self.input.read(r.region, r.start, r.end, p.split, batch_rows=TIMED_BATCH_ROWS):
            if next_offset > r.start and watch.expired():
                receipt(next_offset)
                return
            yield batch
            if batch.num_rows:
                next_offset = int(batch.column("offset")[-1].as_py()) + 1
        receipt(r.end)

    def _keep_dead_letter(self, p: RegionPartition, files: TaskFiles) -> None:
        """The isolated record failed on every attempt: read it for the dead-letter table, not for the query.
        If it cannot be read, the region falls back (no dead letter file) and the record is tried again."""
        r = p.range
        try:
            batches = [b for b in self.input.read(r.region, r.start, r.end, p.split) if b.num_rows]
            if batches:  # no record at that offset: nothing to dead-letter, the region falls back
                files.write_dead_letter(encode_records(batches, self.input.schema))
        except Exception as exc:
            log.warning("regional: epoch %d region %r: could not read offsets [%d, %d) to dead-letter them: %s",
                        p.epoch, r.region, r.start, r.end, exc)

    def commit(self, end: dict[str, Any]) -> None:
        """The sink's epoch record, not Spark's commit, moves a region's offset. A source that wants to hear
        of recorded epochs (Kafka's commitOffsetsToGroup) hears it here, or at the next plan, whichever first:
        Spark commits a source's last batch only when it plans the next one."""
        epoch = int(end.get("epoch", INITIAL_EPOCH))
        if isinstance(self.input, AcknowledgingInput) and epoch > self.told_epoch:  # no store read for others
            self._tell_input(self.store.read_record(epoch))

    def stop(self) -> None:
        """The query stopped (or failed): the next run need not wait out this driver's lease on an object store,
        and the Spark UI tab and metrics show how it ended."""
        try:
            if isinstance(self.input, AcknowledgingInput):  # the last epoch, if Spark stopped before committing it
                try:
                    self._tell_input(self.store.latest_record())
                except Exception as exc:  # heard again first thing at the next start
                    log.warning("regional: the source could not hear of the last epoch at stop: %s", exc)
            if enabled():  # a view: bounded, so that a store that is down cannot hold up the stop
                PUBLISHER.publish_final(str(self.store.checkpoint), timeout_s=10.0)
        finally:
            self.store.release_fence()

    def _tell_input(self, record: EpochRecord | None) -> None:
        if record is None or record.epoch <= self.told_epoch or not isinstance(self.input, AcknowledgingInput):
            return
        self.input.on_recorded(record)
        self.told_epoch = record.epoch
