"""Reading Spark's own checkpoint logs (``offsets/<epoch>``), the plumbing under the sink."""

from __future__ import annotations

from pathlib import Path

from regional.errors import RegionalStoreError
from regional.protocol.plan import EpochPlan


def read_plan(checkpoint: Path, epoch: int) -> EpochPlan:
    """The regional plan Spark logged for ``epoch``: line 3 of ``offsets/<epoch>``.

    Format: ``v1``, a metadata JSON line, then one offset JSON line per source.
    """
    path = checkpoint / "offsets" / str(epoch)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise RegionalStoreError(
            f"Spark's offset log has no entry {path} for epoch {epoch}: the sink's checkpointLocation "
            "must be the query's own checkpoint location"
        ) from None
    sources = [line for line in lines[2:] if line.strip()]
    if len(sources) != 1:
        raise RegionalStoreError(
            f"{path} lists {len(sources)} sources; a regional query reads exactly one regional source "
            "(no unions or joins of two streams)"
        )
    return EpochPlan.parse(sources[0], str(path))
