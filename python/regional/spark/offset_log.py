"""Reading Spark's own checkpoint logs (``offsets/<epoch>``), the plumbing under the sink."""

from __future__ import annotations

from regional.errors import RegionalStoreError
from regional.protocol.plan import EpochPlan
from regional.storage import Storage


def read_plan(checkpoint: Storage, epoch: int) -> EpochPlan:
    """The regional plan Spark logged for ``epoch``: line 3 of ``offsets/<epoch>`` under the checkpoint.

    Format: ``v1``, a metadata JSON line, then one offset JSON line per source.
    """
    name = f"offsets/{epoch}"
    where = checkpoint.describe(name)
    raw = checkpoint.read(name)
    if raw is None:
        raise RegionalStoreError(
            f"Spark's offset log has no entry {where} for epoch {epoch}: the sink's checkpointLocation "
            "must be the query's own checkpoint location"
        )
    lines = raw.decode("utf-8").splitlines()
    sources = [line for line in lines[2:] if line.strip()]
    if len(sources) != 1:
        raise RegionalStoreError(
            f"{where} lists {len(sources)} sources; a regional query reads exactly one regional source "
            "(no unions or joins of two streams)"
        )
    return EpochPlan.parse(sources[0], where)


def latest_logged_epoch(checkpoint: Storage) -> int | None:
    """The newest epoch Spark logged a plan for (``offsets/<epoch>``), None when none yet."""
    epochs = [int(name) for info in checkpoint.list("offsets")
              if (name := info.name.rsplit("/", 1)[-1]).isdigit()]
    return max(epochs) if epochs else None
