"""Regional checkpoints for Spark Structured Streaming.

When some regions (source partitions and their slice of the sink) fail, an epoch publishes the
healthy regions' output and keeps the failed regions at their last good offset, remembering which
epoch they still reference.
"""

from regional.errors import (
    Outage,
    PoisonRecord,
    RegionalConfigError,
    RegionalError,
    RegionalPlanError,
    RegionalStoreError,
)
from regional.spark.session import configure, listener_for, local_spark, progress, register, shim_state, stop
from regional.store.model import RegionState
from regional.store.status import QueryStatus, status
from regional.targets import EpochReport, RegionalTarget, Target

__version__ = "0.2.0"

__all__ = [
    "EpochReport",
    "Outage",
    "PoisonRecord",
    "QueryStatus",
    "RegionState",
    "RegionalConfigError",
    "RegionalError",
    "RegionalPlanError",
    "RegionalStoreError",
    "RegionalTarget",
    "Target",
    "configure",
    "listener_for",
    "local_spark",
    "progress",
    "register",
    "shim_state",
    "status",
    "stop",
]
