"""Step 1 of an epoch, on the driver: the plan (``docs/design.md``, "One epoch").

Each known region gets a range from its committed offset to what its source has, cut by the read
limits (admission control), by a straggler's ``timed_range`` (``regionTimeout``) and, for a region
isolating a poison record (``deadLetterPath`` or ``deadLetterTopic``), to the first half of its suspect
range. Records a source no longer holds (retention) are skipped or fail the query (``failOnDataLoss``). The plan is the
offset JSON Spark logs in ``offsets/N``: it carries everything a task needs, and a restart re-runs it.

Pure: plain functions over the store's model; no Spark, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from regional.bulk import cyclic_gc_paused
from regional.errors import RegionalDataLossError, RegionalStoreError
from regional.protocol.settings import Settings
from regional.store.model import RegionState

INITIAL_EPOCH = -1

class RegionRange(NamedTuple):
    """What one region reads in one epoch: offsets ``start`` (inclusive) to ``end`` (exclusive).

    Per-region values built every epoch (this, ``RegionOutcome``, ``RegionState``, ``Slice``) are NamedTuples:
    immutable, and several times cheaper to build than frozen dataclasses, which matters at 10,000 regions."""

    region: str
    start: int
    end: int
    ref_epoch: int | None  # the epoch whose offset it still uses when it fell back; None when current
    isolated: bool = False  # one suspect record alone: if it fails on every attempt, it is dead-lettered
    # Neighbours of an isolated record, read in the same epoch to show that records beside it pass now (poison
    # needs evidence): one of the plan's ``probes``, never committed, whatever happens. A probe that is also
    # ``isolated`` is a *member*: one record after the suspect, tried alone beside it (``suspectsTogether``), read
    # for the dead letters by its quarantined attempt, and dead-lettered with the suspect on its proof.
    probe: bool = False


@dataclass(frozen=True)
class EpochPlan:
    """The offset Spark logs for one epoch. ``regions`` are the regions with work, sorted by id:
    Spark partition i reads ``regions[i]``; after them, partition ``len(regions) + j`` reads ``probes[j]``.
    Regions without work are in the store, not here."""

    query_id: str
    epoch: int
    store: str  # the checkpoint whose regional store the plan was made against
    regions: tuple[RegionRange, ...]
    settings: Settings
    final: bool = False  # a bounded input: once this plan is published whole, nothing is left to read
    force_reason: str | None = None  # this epoch must be forced-global (a graceful stop asked for it)
    lost: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # region -> (from, to): skipped, gone
    probes: tuple[RegionRange, ...] = ()  # neighbours of the isolated records, read beside them (never committed)
    # Options that build the source again in the sink's phase two, to hear of the epoch there
    # (``AcknowledgingInput.phase_two_options``); nothing secret: this is Spark's offset log.
    acknowledge: Mapping[str, str] = field(default_factory=dict)

    @property
    def ranges(self) -> tuple[RegionRange, ...]:
        """What Spark partition i reads: the regions' ranges, then the probes."""
        return self.regions + self.probes if self.probes else self.regions

    def to_offset(self) -> dict[str, Any]:
        return {
            "query_id": self.query_id,
            "epoch": self.epoch,
            "store": self.store,
            "final": self.final,
            "force_reason": self.force_reason,
            "settings": self.settings.to_json(),
            "regions": [[r.region, r.start, r.end, r.ref_epoch, r.isolated] for r in self.regions],
            "lost": {r: list(span) for r, span in self.lost.items()},
            "probes": [[r.region, r.start, r.end] + ([True] if r.isolated else []) for r in self.probes],
            **({"acknowledge": dict(self.acknowledge)} if self.acknowledge else {}),
        }

    @classmethod
    def parse(cls, text: str, where: str) -> EpochPlan:
        """The plan in the offset JSON ``text`` (a line of Spark's ``offsets/N``, or a progress event's
        ``endOffset``); ``where`` names it in errors."""
        try:
            offset = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise RegionalStoreError(f"{where} holds an unreadable offset ({exc}); was it written by Spark?") from None
        if not isinstance(offset, dict) or "regions" not in offset:
            raise RegionalStoreError(f"{where}: the source offset is not a regional plan")
        return cls.from_offset(offset)

    @classmethod
    def from_offset(cls, offset: Mapping[str, Any]) -> EpochPlan:
        try:
            regions = tuple(RegionRange(str(r), int(s), int(e), None if ref is None else int(ref),
                                        bool(isolated[0]) if isolated else False)
                            for r, s, e, ref, *isolated in offset["regions"])
            probes = tuple(RegionRange(str(r), int(s), int(e), None, bool(member[0]) if member else False, True)
                           for r, s, e, *member in offset.get("probes", ()))
            force = offset["force_reason"]
            lost = {str(r): (int(a), int(b)) for r, (a, b) in offset.get("lost", {}).items()}
            acknowledge = {str(k): str(v) for k, v in offset.get("acknowledge", {}).items()}
            return cls(str(offset["query_id"]), int(offset["epoch"]), str(offset["store"]), regions,
                       Settings.from_json(offset["settings"]), bool(offset["final"]),
                       None if force is None else str(force), lost, probes, acknowledge)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RegionalStoreError(
                f"the offset {str(dict(offset))[:200]} was not written by this version of the regional source "
                f"({type(exc).__name__}: {exc}); a query cannot switch source formats on an existing checkpoint: "
                "start a new checkpointLocation"
            ) from None


def initial_offset(query_id: str, store: str) -> dict[str, Any]:
    """The offset before epoch 0: no region has a range yet."""
    return {"query_id": query_id, "epoch": INITIAL_EPOCH, "store": store, "initial": True}


@dataclass(frozen=True)
class Retention:
    """What a source whose log loses old records (Kafka) says at planning: where each region's log
    begins now, and whether losing records fails the query (``failOnDataLoss``)."""

    log_starts: Mapping[str, int]
    fail_on_data_loss: bool = True
    replaced: frozenset[str] = frozenset()  # regions whose log was replaced (a topic re-created): from its start


@cyclic_gc_paused
def plan_epoch(
    epoch: int,
    query_id: str,
    store: str,
    states: Mapping[str, RegionState],
    available: Mapping[str, int],
    settings: Settings,
    max_per_region: int | None = None,
    max_total: int | None = None,
    ends: Mapping[str, int] | None = None,
    force_reason: str | None = None,
    first_offsets: Mapping[str, int] | None = None,
    retention: Retention | None = None,
    sparse: bool = False,
    now: float | None = None,
    acknowledge: Mapping[str, str] | None = None,
) -> EpochPlan:
    """Plan ``epoch``: each known region from its committed offset to what is available.

    ``available[r]`` is the next offset region ``r`` will have (its end); a region missing from it has
    nothing new. A region not in ``states`` yet starts at ``first_offsets[r]``, else at its log start,
    else 0. ``max_per_region`` and ``max_total`` are read limits (admission control). ``ends`` are a
    bounded input's final ends: the plan that reaches them everywhere is final. ``retention``: records
    below a region's log start are gone; the plan skips them (recorded in ``lost``) or fails. A region
    that is isolating a poison record (``deadLetterPath`` or ``deadLetterTopic``) reads the first half of its
    suspect range. With ``regionTimeout``, a straggler reads no more than its ``timed_range`` (see
    ``timed_range``). ``sparse``: the input's offsets are far apart (``probe_ranges``). With
    ``deadLetterRetries``, a region whose isolated record failed alone is not planned before its retry is due
    (``retry_due``, against ``now``, wall-clock seconds; None: no clock, nothing waits), nor in a graceful stop's
    forced-global epoch (a failed retry there would abort it): it keeps its place, the other regions go on.
    """
    backlog: dict[str, tuple[int, int]] = {}
    lost: dict[str, tuple[int, int]] = {}
    first = first_offsets or {}
    log_starts = retention.log_starts if retention else {}
    isolating = settings.enabled and settings.isolates
    timed = settings.enabled and settings.region_timeout_s is not None
    alone: set[str] = set()  # regions whose range is to be one suspect record
    probes: dict[str, list[tuple[int, int]]] = {}  # neighbours of isolated records, read beside them
    together: dict[str, range] = {}  # the records tried alone beside an isolated record (its members)
    for region in sorted(set(states) | set(available)):
        state = states.get(region)
        start = state.committed_offset if state else first.get(region, log_starts.get(region, 0))
        end = available.get(region, start)
        if retention is not None and region in log_starts:
            log_start = log_starts[region]
            if region in retention.replaced and state is not None:
                lost[region] = (start, log_start)  # the old log's offsets from ``start`` on are gone with it
                start = log_start
            elif end < start or start < log_start:
                skip = check_data_loss(region, start, end, log_start, retention.fail_on_data_loss)
                lost[region] = (start, skip)
                start = skip
        elif end < start:
            raise RegionalStoreError(
                f"region {region!r} now ends at offset {end} but offsets up to {start} were already committed: "
                "its input must be append-only; restore what was removed or start a new checkpointLocation"
            )
        if timed and state is not None and state.timed_range is not None:
            end = min(end, start + state.timed_range)  # a straggler: what it can do within regionTimeout
        due = retry_due(state, settings, now) if isolating and state is not None and start == state.committed_offset \
            else None
        if due is not None and (force_reason is not None or (now is not None and now < due)):
            end = start  # waits for its retry: nothing past its record may go before it
        elif isolating and state is not None and state.isolating is not None and start < state.isolating[1]:
            lo, hi = state.isolating
            # suspectsTogether: a failed range this short is not halved further; its first record is tried alone as
            # the suspect, and the next suspectsTogether - 1 records alone beside it (its members: a burst goes on
            # past the range that failed), to be weighed together.
            forms = state.together_to is None and 1 < settings.suspects_together \
                and hi - start <= settings.suspects_together and start == state.committed_offset == lo
            if start < lo:  # records before the failure found (they passed alone): read as usual, up to it
                end = min(end, lo)
            else:
                end = min(end, start + 1 if forms else isolation_end(start, state.isolating))
            if end == start + 1 and (forms or hi == start + 1):  # the suspect alone
                alone.add(region)
                # A formed set's members, and the record after them: it passed alone when the set formed (or the
                # set would be longer), so it is the witness found then, tried again first like any probe that was.
                # A lowered suspectsTogether (a restart) shrinks a formed set to what it allows (1: none).
                cap = start + settings.suspects_together + 1 if settings.suspects_together > 1 else start + 1
                members = range(start + 1, min(start + settings.suspects_together if forms
                                               else (state.together_to or start) + 1, cap,
                                               available.get(region, start)))
                if members:
                    together[region] = members
                same = start == state.committed_offset  # else records were lost: its evidence is another record's
                # Further afield only while no witness has passed since its last try (or its first failure alone,
                # in that epoch too): the probes that found one are tried again first.
                found = state.probe_passed is not None and state.alone_since is not None \
                    and state.probe_passed >= state.alone_since
                # Probes before it read records this query published: none below where it started (Kafka's
                # startingOffsets=latest) or below what its log still holds.
                floor = max(log_starts.get(region, 0), first.get(region, 0))
                probes[region] = probe_ranges(start, available.get(region, start), floor,
                                              sparse, state.poison, state.alone_waits if same and not found else 0)
        if max_per_region is not None:
            end = min(end, start + max_per_region)
        backlog[region] = (start, end)
    if max_total is not None:
        shares = share_read_limit({r: e - s for r, (s, e) in backlog.items()}, max_total, rotate=epoch)
        backlog = {r: (s, s + shares[r]) for r, (s, _e) in backlog.items()}
    final = ends is not None and all(e >= ends.get(r, e) for r, (_s, e) in backlog.items())
    ranges = tuple(RegionRange(r, s, e, states[r].ref_epoch if r in states else None,
                               r in alone and e == s + 1)
                   for r, (s, e) in backlog.items() if e > s)
    probed = tuple(RegionRange(rr.region, s, e, None, probe=True)
                   for rr in ranges if rr.isolated for s, e in probes.get(rr.region, ()))
    probed += tuple(RegionRange(rr.region, o, o + 1, None, isolated=True, probe=True)
                    for rr in ranges if rr.isolated for o in together.get(rr.region, ()))
    return EpochPlan(query_id, epoch, store, ranges, settings, final, force_reason, lost, probed,
                     dict(acknowledge or {}))


def retry_due(state: RegionState, settings: Settings, now: float | None = None) -> float | None:
    """When a region whose isolated record failed alone may be planned again: ``deadLetterRetryBackoff`` after a
    try with retries left (the settings of the plan being made: a restart with a shorter backoff shortens a wait),
    a short back-off after a failure that was no try (``RegionState.retry_due``). None when it waits for nothing.
    A failure time after ``now`` (a clock that was ahead) counts as ``now``."""
    return state.retry_due(settings.dead_letter_retry_backoff_s, now)


PROBE_SPAN = 8  # offsets the first probes read beside a suspect (several: a Kafka offset may hold no record)
# After a failure alone that found no witness, probes of PROBE_CHUNKS ranges of one size each side, the size cycling
# through 1, 2, 4, ... 2 ** (PROBE_SIZES - 1) offsets: so far at most PROBE_REACH offsets from the suspect.
PROBE_CHUNKS = 3
PROBE_SIZES = 9
PROBE_REACH = PROBE_CHUNKS << (PROBE_SIZES - 1)


def probe_ranges(suspect: int, end: int, first: int, sparse: bool = False, poison: tuple[int, ...] = (),
                 waits: int = 0) -> list[tuple[int, int]]:
    """The witnesses an isolated record at ``suspect`` is tried beside in the same epoch: ranges of records of its own
    region ``[first, end)``, each its own probe (docs/design.md, "Poison or outage"); none when it has none. A probe
    testifies when it passes and writes rows.

    - First (``waits`` 0): of the ``PROBE_SPAN`` offsets before it, the run nearest it without a record dead-lettered
      (``poison``: a poison record stays poison, it is no witness); they were published once. Else the
      ``PROBE_SPAN`` offsets after it, in one probe.
    - After each failure alone that found no witness (``waits``): ``PROBE_CHUNKS`` ranges before it (published
      records, run again; known poison left out), as many after it, and as many at the end of what its region has,
      all of one size, 1, 2, 4, ... offsets, a size larger with each wait, in a cycle. Small ranges find the one
      healthy record between bursts of poison; large ones hold a record that a filter keeps, or one at offsets that
      hold few records. A burst of poison up to ``PROBE_REACH`` long has a witness past it within a cycle, when its
      region has one.

    An input with ``sparse`` offsets, where a span of offsets may hold no record at all, gets two probes: every
    offset of the region before it, and every one after it (the replay sources skip their own dead letters)."""
    before = (first, suspect) if suspect > first else None
    after = (suspect + 1, end) if end > suspect + 1 else None
    if sparse:
        return [span for span in (before, after) if span is not None]
    skip = set(poison)
    # Before it, only records whose dead letters its region still knows (``recent_poison``: PROBE_REACH below it):
    # further down a record may be poison it forgot, and a probe of it that fails would say that published records
    # fail now (``published_failed``: an outage), holding onSuspectTimeout=deadLetter for ever.
    first = max(first, suspect - PROBE_REACH)
    if waits <= 0:
        if before is not None:
            lo, hi = max(first, suspect - PROBE_SPAN), suspect
            while hi > lo and hi - 1 in skip:
                hi -= 1
            run = hi
            while run > lo and run - 1 not in skip:
                run -= 1
            if run < hi:
                return [(run, hi)]
        return [] if after is None else [(suspect + 1, min(end, suspect + 1 + PROBE_SPAN))]
    size = 1 << ((waits - 1) % PROBE_SIZES)
    ranges: list[tuple[int, int]] = []
    hi = suspect
    for _ in range(PROBE_CHUNKS):  # before it, nearest first, past the poison it knows (a burst dead-lettered)
        while hi > first and hi - 1 in skip:
            hi -= 1
        if hi <= first:
            break
        ranges += _without(max(first, hi - size), hi, skip)
        hi -= size
    lo = suspect + 1
    for _ in range(PROBE_CHUNKS):  # after it, nearest first
        if lo >= end:
            break
        ranges.append((lo, min(end, lo + size)))
        lo += size
    hi = end
    for _ in range(PROBE_CHUNKS):  # at the end of its region: records past a burst
        if hi <= lo:
            break
        ranges.append((max(lo, hi - size), hi))
        hi -= size
    return ranges


def _without(lo: int, hi: int, skip: set[int]) -> list[tuple[int, int]]:
    """``[lo, hi)`` in runs that leave out the offsets in ``skip``."""
    runs, start = [], lo
    for offset in range(lo, hi) if skip else ():
        if offset in skip:
            if start < offset:
                runs.append((start, offset))
            start = offset + 1
    if start < hi:
        runs.append((start, hi))
    return runs


def isolation_end(start: int, suspect: tuple[int, int]) -> int:
    """Where an isolating region's range ends: the first half of what is left of its suspect range
    ``[lo, hi)`` (``start`` may be past ``lo``: a prefix of it committed). Bisection: each epoch halves
    the suspect range, so one poison record among n is alone after about log2(n) epochs."""
    left = suspect[1] - start
    return start + max(1, left // 2)


def check_data_loss(region: str, start: int, end: int, log_start: int, fail: bool) -> int:
    """A region's next offset is no longer in its log: fail (failOnDataLoss=true, Spark's default) or
    return where reading goes on (the log start)."""
    if end < start:
        what = (f"region {region!r} now ends at offset {end}, below its committed offset {start}: its log was "
                "truncated, or its topic deleted and created again")
    else:
        what = (f"records [{start}, {log_start}) of region {region!r} were deleted from its log (retention) "
                "before they were read")
    if fail:
        raise RegionalDataLossError(
            f"{what}. With failOnDataLoss=true (the default) the query stops. Set failOnDataLoss=false to go on "
            "from the log start (the loss is recorded in the epoch record and in status), or lengthen retention")
    return log_start


def share_read_limit(backlogs: Mapping[str, int], total: int, rotate: int = 0) -> dict[str, int]:
    """Split a total read limit between regions, max-min fair: small backlogs are served whole, the
    rest share evenly; what rounding leaves goes round-robin from a rotating start, so no region starves.
    A limit below the number of regions with a backlog gives one record each to that many of them, taken
    round-robin from the rotating start: the even share (0) would give every record to the largest backlogs
    epoch after epoch, and a region with a small backlog would wait until they drained (for ever, were they
    fed as fast as they are read)."""
    waiting = sorted(r for r in backlogs if backlogs[r] > 0)
    if 0 < total < len(waiting):
        chosen = {waiting[(rotate + k) % len(waiting)] for k in range(total)}
        return {r: 1 if r in chosen else 0 for r in backlogs}
    order = sorted(backlogs, key=lambda r: (backlogs[r], r))
    left, shares = max(total, 0), {}
    for i, region in enumerate(order):
        take = min(backlogs[region], left // (len(order) - i))
        shares[region] = take
        left -= take
    names = sorted(backlogs)
    for k in range(len(names)):
        if left <= 0:
            break
        region = names[(k + rotate) % len(names)]
        extra = min(backlogs[region] - shares[region], left)
        shares[region] += extra
        left -= extra
    return shares

