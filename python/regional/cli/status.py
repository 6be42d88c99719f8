"""``regional.status(checkpoint)``: the store's view of a query, without a SparkSession."""

from __future__ import annotations

import os
from dataclasses import dataclass

from regional.protocol.epoch import describe
from regional.store import EpochRecord, RegionState, Store


@dataclass(frozen=True)
class QueryStatus:
    checkpoint: str
    regions: dict[str, RegionState]
    epochs: list[EpochRecord]  # the retained epoch records, oldest first

    @property
    def regional_epochs(self) -> int:
        """How many epochs of this query were regional (FLIP-600's first metric)."""
        return self.epochs[-1].regional_epochs if self.epochs else 0

    @property
    def oldest_ref_epoch(self) -> int | None:
        """The oldest epoch a fallen-back region still references (FLIP-600's second metric)."""
        return self.epochs[-1].oldest_ref_epoch if self.epochs else None

    def render(self, epochs: bool = True) -> str:
        lines = [f"checkpoint {self.checkpoint}: {len(self.regions)} regions, {len(self.epochs)} epochs recorded, "
                 f"{self.regional_epochs} regional, oldest ref_epoch {self.oldest_ref_epoch}"]
        if self.regions:
            width = max(6, *(len(r) for r in self.regions))
            lines.append(f"  {'region':<{width}}  {'committed':>10}  {'ref_epoch':>9}  {'failures':>8}  state")
            for region, s in sorted(self.regions.items()):
                ref = "-" if s.ref_epoch is None else str(s.ref_epoch)
                why = f"  ({s.reason})" if s.reason else ""
                lines.append(f"  {region:<{width}}  {s.committed_offset:>10}  {ref:>9}  "
                             f"{s.consecutive_failures:>8}  {s.state.value}{why}")
        if epochs:
            for e in self.epochs:
                lines.append(f"  {describe(e)}")
                lines.extend(f"      {r}: {f.reason}" for r, f in sorted(e.fallen_back.items()))
        return "\n".join(lines)


def status(checkpoint_location: str | os.PathLike[str]) -> QueryStatus:
    store = Store(checkpoint_location)
    records = store.records()
    latest = records[-1] if records else None
    return QueryStatus(str(store.checkpoint), dict(latest.regions) if latest else {}, records)
