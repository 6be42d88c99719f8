"""The regional/global decision of one epoch: pure functions, no Spark, no I/O.

Given what each region's task reported, decide which regions publish, and
compute every region's state after the epoch (DESIGN.md sections 2, 3 and 5.3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum

from regional.config import RegionalPolicy
from regional.plan import EpochPlan


class EpochKind(str, Enum):
    GLOBAL = "global"  # every region that had data committed its slice
    REGIONAL = "regional"  # some regions committed; the others fell back
    FORCED_GLOBAL = "forced_global"  # had to be global, and was
    ABORTED = "aborted"  # nothing published


class Status(str, Enum):
    """What a region's task reported for one epoch."""

    WRITTEN = "written"  # staged its slice (possibly a prefix of it, see ``end``)
    FAILED = "failed"  # the sink's own work failed (committer prepare raised)
    QUARANTINED = "quarantined"  # failed upstream of the sink too often; read nothing


class RegionState(str, Enum):
    OK = "ok"
    FALLEN_BACK = "fallen_back"
    QUARANTINED = "quarantined"


@dataclass(frozen=True)
class RegionOutcome:
    region: str
    status: Status
    end: int  # exclusive end of what was written, for WRITTEN; ignored otherwise
    rows: int = 0
    reason: str | None = None


@dataclass(frozen=True)
class RegionRecord:
    """A region's state in the store after an epoch."""

    committed_offset: int = 0  # the next offset to read
    current_epoch: int | None = None  # last epoch that committed (or confirmed) committed_offset
    consecutive_failures: int = 0
    state: RegionState = RegionState.OK
    reason: str | None = None  # why it last fell back

    @property
    def ref_epoch(self) -> int | None:
        """The epoch whose offset a fallen-back region still uses; None when current.

        -1 means the region's initial offset: no epoch has completed it yet.
        """
        if self.state is RegionState.OK:
            return None
        return -1 if self.current_epoch is None else self.current_epoch


@dataclass(frozen=True)
class Decision:
    kind: EpochKind
    committed: dict[str, tuple[int, int, int]]  # region -> (start, end, rows) published
    fallen_back: dict[str, str]  # region -> reason
    quarantined: frozenset[str]
    reason: str | None  # why the epoch was forced global or aborted
    regions: dict[str, RegionRecord]  # every known region's state after the epoch


def forced_global_reason(previous: Mapping[str, RegionRecord], policy: RegionalPolicy) -> str | None:
    """Tier 1: a region that fell back ``maxConsecutiveFailures`` epochs in a row forces a global epoch."""
    stuck = sorted(r for r, s in previous.items() if s.consecutive_failures >= policy.max_consecutive_failures)
    if not stuck:
        return None
    return (f"{len(stuck)} region(s) fell back {policy.max_consecutive_failures} epochs in a row "
            f"(maxConsecutiveFailures), e.g. {stuck[0]!r}")


def decide(
    plan: EpochPlan,
    outcomes: Mapping[str, RegionOutcome],
    previous: Mapping[str, RegionRecord],
    policy: RegionalPolicy,
    force_reason: str | None = None,
) -> Decision:
    """Decide epoch ``plan.epoch`` from the regions' outcomes.

    ``outcomes`` holds the regions that had work; ``force_reason`` asks for a
    forced-global epoch (a bounded source's last epoch, a graceful stop).
    """
    active = [r for r in plan.regions if r.has_work]
    failed = {r.region: outcomes[r.region] for r in active if outcomes[r.region].status is not Status.WRITTEN}
    force_reason = force_reason or forced_global_reason(previous, policy)
    reset_counters = False

    if not failed:
        kind, reason = (EpochKind.FORCED_GLOBAL, force_reason) if force_reason else (EpochKind.GLOBAL, None)
    elif not policy.enabled:
        kind, reason = EpochKind.ABORTED, "regional epochs are disabled (spark.regional.enabled=false)"
    elif force_reason:
        # Tier 2: the forced-global epoch failed. Publish nothing, reset counters, go on.
        kind, reason, reset_counters = EpochKind.ABORTED, f"forced global epoch failed: {force_reason}", True
    elif len(failed) > policy.max_failure_ratio * len(plan.regions):
        kind = EpochKind.ABORTED
        reason = (f"{len(failed)} of {len(plan.regions)} regions failed, more than "
                  f"maxFailureRatio={policy.max_failure_ratio}")
    else:
        kind, reason = EpochKind.REGIONAL, None

    committed: dict[str, tuple[int, int, int]] = {}
    fallen_back: dict[str, str] = {}
    regions: dict[str, RegionRecord] = {}
    for rr in plan.regions:
        before = previous.get(rr.region, RegionRecord())
        outcome = outcomes.get(rr.region)
        if not rr.has_work:
            regions[rr.region] = replace(before, current_epoch=plan.epoch, consecutive_failures=0,
                                         state=RegionState.OK, reason=None)
        elif kind is not EpochKind.ABORTED and rr.region not in failed:
            assert outcome is not None
            committed[rr.region] = (rr.start, outcome.end, outcome.rows)
            regions[rr.region] = RegionRecord(committed_offset=outcome.end, current_epoch=plan.epoch)
        else:
            own = failed.get(rr.region)
            why = own.reason if own and own.reason else f"epoch aborted: {reason}"
            fallen_back[rr.region] = why
            quarantined = own is not None and own.status is Status.QUARANTINED
            failures = 0 if reset_counters else before.consecutive_failures + (1 if own else 0)
            regions[rr.region] = replace(
                before, consecutive_failures=failures,
                state=RegionState.QUARANTINED if quarantined else RegionState.FALLEN_BACK, reason=why,
            )
    quarantined_regions = frozenset(r for r, o in failed.items() if o.status is Status.QUARANTINED)
    return Decision(kind, committed, fallen_back, quarantined_regions, reason, regions)
