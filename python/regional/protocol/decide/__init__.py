"""Step 3 of an epoch, on the driver: what the tasks reported, checked against the plan, and the decision
(``docs/design.md``, "One epoch").

- ``TaskOutcome`` is a sink task's commit message; ``outcomes_from_tasks`` matches them to the planned
  regions and checks them: anything that does not add up is ``Outcome.MISSING`` (the region falls back).
- ``decide`` makes the epoch's record: the kind (global, regional, forced-global, aborted), what each
  region committed, which fell back and the epoch they still reference, and every region's state after it.
- Dead letters (``deadLetterPath`` or ``deadLetterTopic``): a quarantined region's range becomes its
  ``isolating`` range; later plans read it in halves (``plan.isolation_end``) until the failing record
  stands alone; when that one record fails on every attempt too, it is a suspect: it is dead-lettered, and its
  offset counts as done, only on evidence that it is poison and not an outage (``weigh_evidence``), on its last
  try (``deadLetterRetries``).
- ``regionTimeout``: a straggler's next ranges are sized to what it did within the timeout (``timed_range``).

Pure: plain functions over the store's model; no Spark, no I/O.

The package, by concept: ``outcomes`` (what tasks report, checked), ``verdicts`` (the exception classes the user or
the target named), ``evidence`` (poison or outage, sets, the bound on a suspect), ``decision`` (``decide``).
"""

from __future__ import annotations

from regional.protocol.decide.decision import (
    MIN_TIMED_RANGE,
    STRAGGLER_COST,
    decide,
    epoch_kind,
    failed_beyond,
    fell_back,
    forced_global_reason,
    isolation_narrowing,
    narrows,
    rest_of_isolation,
    straggler_cost,
    timed_range,
    witnessed,
    wrote,
)
from regional.protocol.decide.evidence import (
    MISSING,
    NEIGHBOURS_FAILED,
    NO_NEIGHBOUR,
    NO_SANDWICH,
    UNPROVEN_ADVICE,
    Evidence,
    failing_prefix,
    forget_evidence,
    offsets,
    own_evidence,
    poison_verdict,
    recent_poison,
    set_end,
    shrunk_set,
    unproven_suspects,
    utc,
    weigh_evidence,
)
from regional.protocol.decide.outcomes import (
    DONE,
    UNKNOWN_CAUSE,
    UPSTREAM,
    Member,
    Outcome,
    RegionOutcome,
    TaskOutcome,
    error_of,
    outcomes_all_or_nothing,
    outcomes_from_tasks,
    upstream_partitions,
    with_failure_causes,
)
from regional.protocol.decide.verdicts import (
    Verdict,
    class_matches,
    exception_line,
    failure_class,
    names_failure,
    verdict_of,
)

__all__ = [
    'DONE', 'MIN_TIMED_RANGE', 'MISSING', 'NEIGHBOURS_FAILED', 'NO_NEIGHBOUR', 'NO_SANDWICH', 'STRAGGLER_COST',
    'UNKNOWN_CAUSE', 'UNPROVEN_ADVICE', 'UPSTREAM', 'Evidence', 'Member', 'Outcome', 'RegionOutcome',
    'TaskOutcome', 'Verdict', 'class_matches', 'decide', 'epoch_kind', 'error_of', 'exception_line',
    'failed_beyond', 'failing_prefix', 'failure_class', 'fell_back', 'forced_global_reason', 'forget_evidence',
    'isolation_narrowing', 'names_failure', 'narrows', 'offsets', 'outcomes_all_or_nothing',
    'outcomes_from_tasks', 'own_evidence', 'poison_verdict', 'recent_poison', 'rest_of_isolation', 'set_end',
    'shrunk_set', 'straggler_cost', 'timed_range', 'unproven_suspects', 'upstream_partitions', 'utc',
    'verdict_of', 'weigh_evidence', 'with_failure_causes', 'witnessed', 'wrote',
]
