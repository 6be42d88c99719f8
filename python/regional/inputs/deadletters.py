"""``source=deadLetters``: replay the records a query dead-lettered, from its dead-letter table (``path``:
``deadletter_table``) or its dead-letter topic (``topic``: ``deadletter_topic``).

This module only dispatches: it sits above both replays, which share what they need below them
(``deadletter_rows``) and import neither this module nor each other. Each declares its own ``OPTIONS``.
"""

from __future__ import annotations

from typing import Any

from regional.errors import RegionalConfigError
from regional.inputs.base import RegionInput
from regional.inputs.deadletter_rows import spark_ddl
from regional.inputs.deadletter_table import DeadLetterInput

__all__ = ["DeadLetterInput", "create", "spark_ddl"]  # the table replay's names, as before the split


def create(options: dict[str, str]) -> RegionInput[Any]:
    """``path``: a dead-letter table; ``topic``: a dead-letter topic."""
    given = {k.lower() for k, v in options.items() if str(v).strip()}
    if "topic" in given:
        if "path" in given:
            raise RegionalConfigError("source=deadLetters reads a dead-letter table (path) or a dead-letter topic "
                                      "(topic), not both: replay each with its own query")
        from regional.inputs.deadletter_topic import DeadLetterTopicInput  # Kafka's client only when asked for

        return DeadLetterTopicInput(options)
    return DeadLetterInput(options)
