"""Errors a user can see. Each message says what is wrong and what to do."""

from __future__ import annotations

# The advice of an error whose only way on is a new query. A new checkpoint is a new query (docs/design.md): it
# reads its input again from its starting point, so into the same target it would publish every record twice.
NEW_QUERY = ("start a new query: a new checkpointLocation and a new, empty target (a new query reads its input "
             "again from its start, so into the same target it would publish every record a second time)")


class RegionalError(Exception):
    """Base class of every error raised by ``regional``."""


class RegionalConfigError(RegionalError, ValueError):
    """A query, option or conf key that ``regional`` cannot run with."""


class RegionalStoreError(RegionalError):
    """The regional store under ``<checkpointLocation>/regional/`` is unreadable or inconsistent."""


class RegionalPlanError(RegionalError):
    """The rows reaching the sink do not match the regions the source planned."""


class RegionalDataLossError(RegionalError):
    """Records a region still needed are gone from its source (retention, a deleted topic): failOnDataLoss."""


class RegionalDeadLetterLimitError(RegionalError):
    """More records would be dead-lettered in one epoch than ``maxDeadLettersPerEpoch`` allows."""
