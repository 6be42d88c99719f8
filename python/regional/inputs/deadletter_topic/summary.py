"""``python -m regional dead-letters kafka:<topic>``: a dead-letter topic's letters, and which a replay took."""

from __future__ import annotations

from collections.abc import Mapping

from regional.dead_letters import DeadLetterSummary
from regional.inputs.deadletter_topic.letters import HEADER, Letter
from regional.inputs.deadletter_topic.marks import Takes
from regional.inputs.deadletter_topic.source import DeadLetterTopicInput
from regional.targets import TOPIC_PLACE


def topic_summary(options: Mapping[str, str]) -> DeadLetterSummary:
    """``python -m regional dead-letters kafka:<topic>``: the letters in the topic (``options`` as the replay's:
    ``topic``, ``kafka.bootstrap.servers``, ``kafka.*``, ``replayGroup``), which of them a replay took (the
    group's marks), by region and error class."""
    source = DeadLetterTopicInput(options, read_letters=False)
    out = DeadLetterSummary(TOPIC_PLACE + source.topic, None)
    seen: list[tuple[Letter, int, str]] = []

    def visit(letter: Letter, headers: dict[str, bytes]) -> None:
        error = headers.get(HEADER + "error.class", b"unknown").decode(errors="replace")
        message = headers.get(HEADER + "error.message", b"").decode(errors="replace")
        epoch = headers.get(HEADER + "epoch")
        seen.append((letter, int(epoch) if epoch is not None else -1, f"{error}: {message}" if message else error))

    source._read_topic(visit=visit)
    taken = source._group_takes(first=True, carry=False)  # reads; never writes
    for letter, epoch, error in seen:
        out.add(letter.region, letter.offset, epoch, error, letter.position in taken.get(letter.partition, Takes()))
    return out

