"""Environment switches for what regional does on its own (``REGIONAL_STATUS``, ``REGIONAL_KAFKA_POOL``,
``REGIONAL_GC_FREEZE``): on unless set to off, false, 0 or no. Query settings are options, not these."""

from __future__ import annotations

import os

OFF = ("off", "false", "0", "no")


def switched_on(name: str) -> bool:
    """Whether the switch ``name`` is on in this process's environment (it is, when unset)."""
    return os.environ.get(name, "on").strip().lower() not in OFF
