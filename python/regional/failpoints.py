"""Fail-points for crash tests. Inert unless a test sets ``REGIONAL_FAILPOINT``.

``REGIONAL_FAILPOINT=<name>:<epoch>`` makes the process that reaches
``<name>`` in that epoch (``<name>:*``: in any epoch) write
``REGIONAL_FAILPOINT_FILE`` and then hang, so the test can SIGKILL the whole
query process tree at exactly that point.
"""

from __future__ import annotations

import os
import time


def reach(name: str, epoch: int) -> None:
    spec = os.environ.get("REGIONAL_FAILPOINT")
    if not spec or spec not in (f"{name}:{epoch}", f"{name}:*"):
        return
    marker = os.environ.get("REGIONAL_FAILPOINT_FILE")
    if marker:
        with open(marker, "w") as f:
            f.write(f"{name}:{epoch}:{os.getpid()}\n")
    while True:  # wait here to be killed
        time.sleep(1)
