"""The regional store: one query's metadata under ``<checkpointLocation>/regional/``, driver-only."""

from regional.store.model import DeadLetter, EpochKind, EpochRecord, FallBack, Intent, RegionState, Slice, Standing
from regional.store.store import STORE_DIR, Store

__all__ = ["STORE_DIR", "DeadLetter", "EpochKind", "EpochRecord", "FallBack", "Intent", "RegionState", "Slice",
           "Standing", "Store"]
