"""Offset planning for one epoch: pure functions, no Spark.

Each region's range starts at its *committed* offset (from the store), not at
the previous epoch's end, so that a fallen-back region re-reads its slice.
The plan is what the source returns as its end offset: Spark writes it to
``offsets/<epoch>``, so a restart re-runs exactly the same plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from regional.errors import RegionalStoreError

INITIAL_EPOCH = -1


@dataclass(frozen=True)
class RegionRange:
    """What one region reads in one epoch: offsets ``start`` (inclusive) to ``end`` (exclusive)."""

    region: str
    start: int
    end: int
    ref_epoch: int | None  # the last epoch in which this region was whole; None if never

    @property
    def has_work(self) -> bool:
        return self.end > self.start


@dataclass(frozen=True)
class RegionCursor:
    """What planning needs to know of a region from the store."""

    committed_offset: int = 0
    current_epoch: int | None = None


@dataclass(frozen=True)
class EpochPlan:
    epoch: int
    store: str  # the regional store the source planned against; the sink must share it
    regions: tuple[RegionRange, ...]  # sorted by region id: partition i reads regions[i]
    final: bool = False  # a bounded input: once this plan is published whole, nothing is left to read
    force_reason: str | None = None  # this epoch must be forced-global (a graceful stop asked for it)

    @property
    def has_work(self) -> bool:
        return any(r.has_work for r in self.regions)

    def to_offset(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "store": self.store,
            "final": self.final,
            "force_reason": self.force_reason,
            "regions": {r.region: {"start": r.start, "end": r.end, "ref_epoch": r.ref_epoch}
                        for r in self.regions},
        }

    @classmethod
    def from_offset(cls, offset: Mapping[str, Any]) -> EpochPlan:
        try:
            regions = tuple(
                RegionRange(region, int(v["start"]), int(v["end"]),
                            None if v.get("ref_epoch") is None else int(v["ref_epoch"]))
                for region, v in offset["regions"].items()
            )
            force = offset.get("force_reason")
            return cls(int(offset["epoch"]), str(offset.get("store", "")), regions, bool(offset.get("final", False)),
                       None if force is None else str(force))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RegionalStoreError(
                f"the offset {str(dict(offset))[:200]} was not written by the regional source ({exc!r}); "
                "a query cannot switch source formats on an existing checkpoint: start a new checkpointLocation"
            ) from None


def initial_offset(store: str) -> dict[str, Any]:
    return {"epoch": INITIAL_EPOCH, "store": store, "regions": {}}


def plan_epoch(
    epoch: int,
    store: str,
    cursors: Mapping[str, RegionCursor],
    available: Mapping[str, int],
    max_records_per_region: int | None = None,
    ends: Mapping[str, int] | None = None,
    force_reason: str | None = None,
) -> EpochPlan:
    """Plan ``epoch``: every known region, from its committed offset to what is available.

    ``available`` maps a region to the number of records it holds (offsets
    ``0 .. n-1``). A region known to the store but missing from ``available``
    has nothing new. ``max_records_per_region`` caps each range (admission control).
    ``ends`` are a bounded input's final sizes: the plan that reaches them everywhere is final.
    """
    ranges = []
    for region in sorted(set(cursors) | set(available)):
        cursor = cursors.get(region, RegionCursor())
        start = cursor.committed_offset
        end = available.get(region, start)
        if end < start:
            raise RegionalStoreError(
                f"region {region!r} now holds {end} records but {start} were already committed: "
                "its input must be append-only; restore the files that were removed or start a new checkpoint"
            )
        if max_records_per_region is not None:
            end = min(end, start + max_records_per_region)
        ranges.append(RegionRange(region, start, end, cursor.current_epoch))
    final = ends is not None and all(r.end >= ends.get(r.region, r.end) for r in ranges)
    return EpochPlan(epoch, store, tuple(ranges), final, force_reason)
