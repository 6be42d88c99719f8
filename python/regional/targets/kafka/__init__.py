"""``target=kafka``: rows to Kafka topics, exactly once per region for ``read_committed`` consumers.

Spark's Kafka sink's interface with Spark's meaning (``records``: ``value``, ``key``, ``headers``, ``topic``,
``partition``; ``settings``: ``topic``, ``kafka.bootstrap.servers`` and every producer setting as ``kafka.<name>``).

Phase one (task): the region's rows are checked against the topics' metadata (a partition that does not exist, a
record larger than the producer or topic takes, a null topic: the row's own fault, ``RowsInvalid``; a broker out
of reach: the region's failure) and staged as one Arrow file under ``stagingLocation``. Nothing reaches Kafka.

Phase two (driver): the published regions' staged rows are produced, region after region in the region's order,
in one transaction per epoch under the transactional id ``regional-<query id>-kafka``, with the commit marker
inside it (``transaction``). A re-run after a crash reads the marker after fencing the crashed driver's producer:
an epoch it covers is not produced again. ``abort`` and ``sweep`` remove staged files.

Why the driver produces (measured in BENCHMARKS.md, "Kafka target"): a Kafka transaction is committed only by the
producer that began it (KIP-939 would change that; librdkafka lacks it), so tasks that produced would have to
commit in phase one, before the driver decides: a probe's rows, a region cut at ``regionTimeout`` or an epoch
the decision aborts would be visible to ``read_committed`` consumers. Staging keeps phase two the only publisher,
as for every target; its cost is the driver producing every record.
"""

from __future__ import annotations

from regional.targets.kafka.settings import OPTIONS
from regional.targets.kafka.target import KafkaTarget, KafkaTargetError

__all__ = ["OPTIONS", "KafkaTarget", "KafkaTargetError", "create"]


def create(options: dict[str, str]) -> KafkaTarget:
    return KafkaTarget(options)
