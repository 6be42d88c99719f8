"""The store's read model: ``regional.status(checkpoint)``, the view of a query that ``python -m regional
status`` prints, the listener reports and ``regional.progress`` returns, without a SparkSession. It reads the
newest epoch record, the records regions still reference, and as many recent records as asked for, so that it
stays fast with many regions and epochs."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from regional.store.model import EpochKind, EpochRecord, RegionState, Standing
from regional.store.store import Store


@dataclass(frozen=True)
class Progress:
    """The figures a dashboard needs, as of the newest recorded epoch (``regional.progress(query)``, and the
    listener's per-query metrics). Spark 4.2 lets Python sources and sinks add nothing to ``lastProgress``."""

    epoch: int | None  # the newest recorded epoch
    kind: str | None  # global | regional | forced_global | aborted
    regional_epochs: int  # FLIP-600's first metric
    oldest_ref_epoch: int | None  # FLIP-600's second metric
    regions: int  # regions known to the query
    fallen_back: int  # regions behind now, quarantined ones not counted
    quarantined: int  # regions behind now whose last failure was upstream of the sink (quarantined)
    max_lag: int | None  # offsets the source has seen that are not committed, largest over regions
    dead_letters: int = 0  # records dead-lettered so far, all regions
    isolating: int = 0  # regions isolating a poison record now
    outage_epochs: int = 0  # epochs in a row in which every region with work failed (an outage, backing off)
    retries_pending: int = 0  # isolated records that failed alone and wait for a retry (deadLetterRetries)
    # regions whose isolated record failed alone with nothing yet to tell it from an outage: waiting, not poison
    outage_suspects: int = 0


@dataclass(frozen=True)
class QueryStatus:
    checkpoint: str
    regions: dict[str, RegionState]  # every known region's state after the newest epoch
    epochs: list[EpochRecord]  # retained epoch records, oldest first (the newest ones, when limited)
    latest_offsets: dict[str, int] = field(default_factory=dict)  # each region's end as the source last saw it
    ref_recorded_at: dict[int, float] = field(default_factory=dict)  # when each referenced epoch was recorded
    log_starts: dict[str, int] | None = None  # each region's log start (sources with retention, e.g. Kafka)
    created_at: float | None = None
    now: float = 0.0

    @property
    def last_epoch(self) -> int | None:
        return self.epochs[-1].epoch if self.epochs else None

    @property
    def regional_epochs(self) -> int:
        """How many epochs of this query were regional (FLIP-600's first metric)."""
        return self.epochs[-1].regional_epochs if self.epochs else 0

    @property
    def oldest_ref_epoch(self) -> int | None:
        """The oldest epoch a fallen-back region still references (FLIP-600's second metric)."""
        return self.epochs[-1].oldest_ref_epoch if self.epochs else None

    def latest_offset(self, region: str) -> int | None:
        return self.latest_offsets.get(region)

    def lag(self, region: str) -> int | None:
        """Offsets the source has seen that the region has not committed (records, for files)."""
        latest, state = self.latest_offsets.get(region), self.regions.get(region)
        if latest is None:
            return None
        return max(latest - (state.committed_offset if state else 0), 0)

    def retention_headroom(self, region: str) -> int | None:
        """Offsets between the region's committed offset and its log start: how much retention may still
        delete before the region loses records it needs (negative: already lost). None without retention."""
        if self.log_starts is None or region not in self.log_starts or region not in self.regions:
            return None
        return self.regions[region].committed_offset - self.log_starts[region]

    def ref_age(self, region: str) -> tuple[int | None, float | None]:
        """How old a fallen-back region's ref_epoch is, in epochs and in seconds; (None, None) when current."""
        state = self.regions.get(region)
        if state is None or state.ref_epoch is None or self.last_epoch is None:
            return None, None
        if state.ref_epoch < 0:  # never committed: as old as when it was first seen (else the query)
            first = state.first_seen_epoch
            since = state.first_seen_at if state.first_seen_at is not None else self.created_at
            return (self.last_epoch + 1 if first is None else self.last_epoch - first + 1,
                    None if since is None else max(self.now - since, 0.0))
        since = self.ref_recorded_at.get(state.ref_epoch)
        return self.last_epoch - state.ref_epoch, None if since is None else max(self.now - since, 0.0)

    def retry(self, region: str) -> tuple[int, int, float | None] | None:
        """A region whose isolated record failed alone and waits for a retry (deadLetterRetries): (tries so far,
        of how many, when the next is due by the newest epoch's settings); None when it waits for none."""
        state, last = self.regions.get(region), self.epochs[-1] if self.epochs else None
        if state is None or not state.failed_alone:
            return None
        retries, backoff = (last.dead_letter_retries, last.dead_letter_retry_backoff_s) if last else (0, 0.0)
        due = state.retry_due(backoff, self.now)  # as the next plan computes it
        return state.failed_alone, max(retries + 1, state.failed_alone + 1), due

    def waiting(self, region: str) -> tuple[str, float | None] | None:
        """Why a region whose isolated record failed alone waits, and until when (as the next plan computes it):
        ``outage`` (nothing yet tells its failures from an outage: records of its region beside it failed too, or it
        has none; it is never dead-lettered on that), ``evidence`` (records beside it passed since its first failure
        alone: one more failure alone is a try), ``retry`` (a try with retries left, deadLetterRetries). None when it
        waits for nothing."""
        state, last = self.regions.get(region), self.epochs[-1] if self.epochs else None
        if state is None or state.failed_alone_at is None or state.ref_epoch is None:
            return None
        due = state.retry_due(last.dead_letter_retry_backoff_s if last else 0.0, self.now)
        if not state.alone_waits:
            return ("retry", due) if state.failed_alone else None
        passed, since = state.probe_passed, state.alone_since
        return ("evidence" if passed is not None and since is not None and passed > since else "outage"), due

    def resolved_by(self, region: str) -> tuple[float, str] | None:
        """When a region's suspect is resolved at the latest (``suspectTimeout`` after its first failure alone, by the
        newest epoch's settings) and what happens then if it is not proven poison before: ``the query fails`` or
        ``dead-lettered`` (``onSuspectTimeout``). None when no suspect of it waits, or no bound runs."""
        state, last = self.regions.get(region), self.epochs[-1] if self.epochs else None
        if state is None or state.suspect_since_at is None or state.ref_epoch is None or last is None \
                or last.suspect_timeout_s is None:
            return None
        return (state.suspect_since_at + last.suspect_timeout_s,
                "dead-lettered" if last.dead_letter_on_timeout else "the query fails")

    def waiting_json(self, region: str) -> dict[str, Any] | None:
        why = self.waiting(region)
        if why is None:
            return None
        s = self.regions[region]
        return {"offset": s.committed_offset, "looks_like": why[0], "failures_alone": s.alone_waits,
                "tries": s.failed_alone, "due_at": why[1]}

    def retry_json(self, region: str) -> dict[str, Any] | None:
        retry = self.retry(region)
        if retry is None:
            return None
        tries, of, due = retry
        return {"offset": self.regions[region].committed_offset, "tries": tries, "of": of, "due_at": due}

    def region_json(self, region: str) -> dict[str, Any]:
        s = self.regions[region]
        age_epochs, age_s = self.ref_age(region)
        return {"state": s.state.value, "committed_offset": s.committed_offset,
                "latest_offset": self.latest_offset(region), "lag": self.lag(region), "ref_epoch": s.ref_epoch,
                "ref_age_epochs": age_epochs, "ref_age_seconds": None if age_s is None else round(age_s, 3),
                "consecutive_failures": s.consecutive_failures, "reason": s.reason,
                "retention_headroom": self.retention_headroom(region), "dead_letters": s.dead_letters,
                "isolating": None if s.isolating is None else list(s.isolating), "timed_range": s.timed_range,
                "retry": self.retry_json(region), "waiting": self.waiting_json(region),
                "resolved_by": self.resolved_by_json(region)}

    def resolved_by_json(self, region: str) -> dict[str, Any] | None:
        bound = self.resolved_by(region)
        return None if bound is None else {"at": bound[0], "unproven_then": bound[1]}

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "regional_epochs": self.regional_epochs,
            "oldest_ref_epoch": self.oldest_ref_epoch,
            "regions": {r: self.region_json(r) for r in sorted(self.regions)},
            "epochs": [{"epoch": e.epoch, "kind": e.kind.value, "reason": e.reason, "recorded_at": e.recorded_at,
                        "outage_epochs": e.outage_epochs, "backoff_s": e.backoff_s,
                        "committed": {r: {"start": s.start, "end": s.end, "rows": s.rows, "cut": s.cut}
                                      for r, s in e.committed.items()},
                        "fallen_back": {r: {"ref_epoch": f.ref_epoch, "reason": f.reason,
                                            "quarantined": f.quarantined} for r, f in e.fallen_back.items()},
                        "lost": {r: {"from": a, "to": b} for r, (a, b) in e.lost.items()},
                        "dead_lettered": {r: {"offset": d.offset, "error": d.error, "records": d.count}
                                          for r, d in e.dead_lettered.items()}}
                       for e in self.epochs],
        }

    def progress(self) -> Progress:
        lags = [lag for r in self.regions if (lag := self.lag(r)) is not None]
        states = [s.state for s in self.regions.values()]
        return Progress(self.last_epoch, self.epochs[-1].kind.value if self.epochs else None, self.regional_epochs,
                        self.oldest_ref_epoch, len(self.regions), states.count(Standing.FALLEN_BACK),
                        states.count(Standing.QUARANTINED), max(lags) if lags else None,
                        sum(s.dead_letters for s in self.regions.values()),
                        sum(s.isolating is not None for s in self.regions.values()),
                        self.epochs[-1].outage_epochs if self.epochs else 0,
                        sum(s.failed_alone > 0 for s in self.regions.values()),
                        sum((self.waiting(r) or ("",))[0] == "outage" for r, s in self.regions.items()
                            if s.alone_waits))


SNAPSHOT_EPOCHS = 20  # the newest epochs a snapshot shows
SNAPSHOT_EPOCH_REGIONS = 20  # of each epoch's fallen-back and dead-lettered regions, the first ones by name


def snapshot(st: QueryStatus, timeline_svg: str | None = None) -> dict[str, Any]:
    """The status as the JVM shim shows it in the Spark UI and exports it as metrics (``status.json``): the
    query's figures, every region's row, and a summary of each recent epoch (counts, and the first fallen-back
    and dead-lettered regions with their reasons, so that 10,000 regions do not make it megabytes per epoch)."""
    last = st.epochs[-1] if st.epochs else None
    ages = [st.ref_age(r) for r in st.regions]
    lags = [lag for r in st.regions if (lag := st.lag(r)) is not None]
    kinds = [e.kind.value for e in st.epochs]
    metrics = {
        **asdict(st.progress()),
        "regions_with_work": len({*last.committed, *last.fallen_back, *last.dead_lettered}) if last else 0,
        "oldest_ref_age_epochs": max((a for a, _ in ages if a is not None), default=0),
        "oldest_ref_age_seconds": round(max((s for _, s in ages if s is not None), default=0.0), 3),
        "lag": sum(lags),
        "backoff_seconds": last.backoff_s if last else 0.0,
        "epochs_total": last.epoch + 1 if last else 0,
        "recent_epochs": {kind.value: kinds.count(kind.value) for kind in EpochKind},
    }

    def first(items: dict[str, Any]) -> dict[str, Any]:
        return {r: items[r] for r in sorted(items)[:SNAPSHOT_EPOCH_REGIONS]}

    epochs = [{"epoch": e.epoch, "kind": e.kind.value, "reason": e.reason, "recorded_at": e.recorded_at,
               "committed": len(e.committed), "rows": sum(c.rows for c in e.committed.values()),
               "fallen_back": len(e.fallen_back),
               "dead_lettered": sum(d.count for d in e.dead_lettered.values()),
               "fallen_back_regions": first({r: f.reason for r, f in e.fallen_back.items()}),
               "dead_lettered_regions": first({r: d.error for r, d in e.dead_lettered.items()})}
              for e in st.epochs[-SNAPSHOT_EPOCHS:]]
    return {"checkpoint": st.checkpoint, "taken_at": st.now, "metrics": metrics,
            "regions": {r: st.region_json(r) for r in sorted(st.regions)}, "epochs": epochs,
            "timeline_svg": timeline_svg}


def status(checkpoint_location: str | os.PathLike[str], epochs: int | None = None) -> QueryStatus:
    """The query's regions and its retained epoch records (the newest ``epochs`` of them, if given)."""
    store = Store(checkpoint_location)
    numbers = store.epochs()
    shown = numbers if epochs is None else numbers[-epochs:] if epochs > 0 else numbers[-1:]
    records = {e: r for e in shown if (r := store.read_record(e)) is not None}
    latest = records[numbers[-1]] if numbers else None
    regions = dict(latest.regions) if latest else {}
    refs = {s.ref_epoch for s in regions.values() if s.ref_epoch is not None and s.ref_epoch >= 0}
    recorded_at = {}
    for ref in refs:
        record = records.get(ref) or store.read_record(ref)
        if record is not None:
            recorded_at[ref] = record.recorded_at
    return QueryStatus(str(store.checkpoint), regions, [records[e] for e in sorted(records)],
                       store.read_latest_offsets(), recorded_at, store.read_log_starts(), store.created_at(),
                       time.time())
