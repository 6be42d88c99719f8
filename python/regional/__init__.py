"""Regional checkpoints for Spark Structured Streaming.

When some regions (source partitions and their slice of the sink) fail, an
epoch publishes the healthy regions' output and keeps the failed regions at
their last good offset, remembering which epoch they still reference.
"""

from regional.committers import Committer, DeltaCommitter, EpochReport, RegionalCommitter
from regional.errors import RegionalConfigError, RegionalError, RegionalPlanError, RegionalStoreError
from regional.session import listener_for, local_spark, register, shim_state, stop
from regional.status import QueryStatus, RegionStatus, status

__version__ = "0.1.0"

__all__ = [
    "Committer",
    "DeltaCommitter",
    "EpochReport",
    "QueryStatus",
    "RegionStatus",
    "RegionalCommitter",
    "RegionalConfigError",
    "RegionalError",
    "RegionalPlanError",
    "RegionalStoreError",
    "listener_for",
    "local_spark",
    "register",
    "shim_state",
    "status",
    "stop",
]
