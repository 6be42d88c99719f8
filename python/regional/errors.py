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


class RegionalSuspectTimeoutError(RegionalError):
    """A suspect record was neither proven poison nor passed within ``suspectTimeout`` (``onSuspectTimeout=fail``)."""


class _Verdict(Exception):
    """A UDF's own verdict about the record it failed on. The driver sees the class by the exception line of the
    failure (``regional.errors.PoisonRecord: ...``), which must be one line: a message of many lines is joined."""

    def __str__(self) -> str:
        return " ".join(super().__str__().split())


class PoisonRecord(_Verdict):
    """Raise it in a UDF (or anything between the regional source and sink) to say "this record is at fault": with
    ``deadLetterPath`` or ``deadLetterTopic``, the record, once isolated alone by bisection and failing alone on every
    attempt, is dead-lettered at once, without the evidence and retries an unknown exception waits for
    (docs/dead-letters.md, "Your own verdict"). Raise it only for what depends on the record alone (it cannot be
    parsed, a value is out of range), never for a service that failed: that is ``Outage``. ``raise PoisonRecord(...)
    from exc`` keeps the cause in the dead letter's traceback; the class is told by its name, so raise this class,
    not a subclass (or name the subclass in ``deadLetterOn``)."""


class Outage(_Verdict):
    """Raise it in a UDF to say "what the record needs is down, the record is fine": the record is never
    dead-lettered, however long this lasts; its region is tried again with back-off, like an outage
    (docs/outages.md). Raise this class, not a subclass (or name the subclass in ``outageOn``)."""
