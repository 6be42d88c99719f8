"""Targets: one module per target (``delta``, ``postgres``, ``kafka``, ``python_class``), each a ``base.Target``.

``load_target`` builds the one a sink's options name; ``dead_letter_target`` the sink of a query's dead
letters: a Delta table at ``deadLetterPath`` or a Kafka topic, ``deadLetterTopic`` (``kafka_topic``); a
dead-letter sink is a target like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from regional.errors import RegionalConfigError
from regional.location import same_location
from regional.plugins import find_plugin
from regional.targets import python_class
from regional.targets.base import QUERY_ID_OPTION, EpochReport, RegionalTarget, Target

__all__ = ["EpochReport", "RegionalTarget", "Target", "dead_letter_place", "dead_letter_target", "load_target"]

# The internal option that makes a Delta target a dead-letter table (its columns must match exactly).
DEAD_LETTERS_OPTION = "regional.deadletters"
# A dead-letter place that is a Kafka topic: ``kafka:<topic>`` (a table's path is absolute or ``scheme://...``).
TOPIC_PLACE = "kafka:"


def load_target(options: Mapping[str, str]) -> Target[Any]:
    """Build the target named by the sink's ``target`` option."""
    name = options.get("target")
    if not name:
        raise RegionalConfigError(
            "the regional sink needs a target: add .option('target', 'delta') "
            "or .option('target', 'python:<module>:<Class>') to writeStream"
        )
    if name.startswith("python:"):
        return python_class.load(name, dict(options))
    module = find_plugin("regional.targets", name)
    if module is None:
        raise RegionalConfigError(f"unknown target {name!r}: use target=delta, target=postgres, target=kafka or "
                                  "target=python:<module>:<Class>")
    return python_class.as_target(name, module.create(dict(options)), dict(options))


def dead_letter_place(path: str | None, topic: str | None) -> str | None:
    """Where a query's dead letters go, as one text: the table's path, or ``kafka:<topic>``; None: nowhere."""
    if path is not None:
        return path
    return None if topic is None else TOPIC_PLACE + topic


def same_place(a: str, b: str) -> bool:
    """Whether two places of records (``dead_letter_place``'s texts) are the same table or topic."""
    if a.startswith(TOPIC_PLACE) or b.startswith(TOPIC_PLACE):
        return a == b
    return same_location(a, b)


def dead_letter_target(location: str, query_id: str, options: Mapping[str, str] | None = None) -> Target[Any]:
    """The sink of a query's dead letters at ``location`` (``dead_letter_place``): a Delta table whose columns
    must be the dead letters' own (the source's columns, then ``epoch`` and ``error``), or a Kafka topic whose
    producer is configured by the sink's ``deadLetter.kafka.*`` ``options`` (``kafka_topic``)."""
    if location.startswith(TOPIC_PLACE):
        from regional.targets import kafka_topic

        return kafka_topic.DeadLetterTopic(location[len(TOPIC_PLACE):], query_id, options or {})
    return load_target({"target": "delta", "path": location, QUERY_ID_OPTION: query_id, DEAD_LETTERS_OPTION: "true"})
