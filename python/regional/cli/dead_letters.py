"""``python -m regional dead-letters <table>`` (or ``kafka:<topic>``): prints a dead-letter table's or topic's
summary (``regional.dead_letters``, ``regional.inputs.deadletter_topic.topic_summary``)."""

from __future__ import annotations

import json

from regional.dead_letters import DeadLetterSummary, summary
from regional.targets import TOPIC_PLACE


def render(s: DeadLetterSummary) -> str:
    """The summary as text: one line for the table, then regions, then error classes."""
    version = "" if s.version is None else f" (version {s.version})"
    lines = [f"dead letters in {s.table}{version}: {s.records} record(s), {s.records - s.replayed} "
             f"waiting for a replay, {s.replayed} replayed"]
    if not s.records:
        return "\n".join(lines)
    width = max(6, *(len(repr(r)) for r in s.regions))
    lines.append(f"  {'region':<{width}}  {'records':>7}  {'waiting':>7}  {'oldest (epoch, offset)':>22}  "
                 f"{'newest (epoch, offset)':>22}")
    for region, g in sorted(s.regions.items()):
        lines.append(f"  {region!r:<{width}}  {g.records:>7}  {g.waiting:>7}  {_at(g.oldest):>22}  "
                     f"{_at(g.newest):>22}")
    lines.append("  by error class:")
    lines.extend(f"    {n:>7}  {kind}" for kind, n in sorted(s.error_classes.items(), key=lambda kv: (-kv[1], kv[0])))
    for name, letter in (("oldest", s.oldest), ("newest", s.newest)):
        if letter is not None:
            lines.append(f"  {name}: epoch {letter['epoch']}, region {letter['region']!r} offset {letter['offset']}: "
                         f"{letter['error']!r}")
    return "\n".join(lines)


def _at(at: tuple[int, int] | None) -> str:
    return "-" if at is None else f"({at[0]}, {at[1]})"


def show(table: str, as_json: bool, options: dict[str, str] | None = None) -> None:
    """``table``: a dead-letter table, or ``kafka:<topic>`` with the consumer's ``options`` (``kafka.*``,
    ``replayGroup``)."""
    if table.startswith(TOPIC_PLACE):
        from regional.inputs.deadletter_topic import topic_summary

        found = topic_summary({**(options or {}), "topic": table[len(TOPIC_PLACE):]})
    else:
        found = summary(table)
    print(json.dumps(found.to_json(), indent=2) if as_json else render(found))
