"""The clock of ``regionTimeout``: when a region's source must stop reading.

The source checks its deadline between the small batches it emits; rows it
has already emitted flow on and are published. Two facts measured on Spark 4.2
shape this:

- The Python workers between source and sink (a UDF's, the sink's own) take a
  second or more to start, so the clock starts when the sink receives its first
  rows (the sink leaves a marker file), not when the source starts reading.
- The source cannot wait for the sink to catch up: with a Python UDF between
  them, one task thread moves rows from source to UDF to sink, and while the
  source's ``read()`` waits, that thread waits on it and no row reaches the
  sink. So how far the source runs ahead of a slow UDF is bounded only by the
  buffers between them (sockets, and Arrow batches of
  ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows): the cut takes effect
  once they are full, and what is in them when the deadline passes is still
  processed and published.
"""

from __future__ import annotations

import time
from pathlib import Path

# With regionTimeout the source reads in batches this small: the clock is checked between them.
TIMED_BATCH_ROWS = 100


def mark_sink_receiving(path: Path) -> None:
    """The sink's side, once per task attempt: it has received its first rows.

    The source's clock starts then: the Python workers between source and sink
    (a UDF's, the sink's own) take a second or more to start, which must not
    count against the timeout.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


class SinkWatch:
    """The source's side: the region's deadline.

    The deadline is ``timeout`` after the sink received its first rows; if it receives none
    (still starting, or the query filters out everything read so far), the source gives up
    ``timeout + startup_grace`` after it started reading.
    """

    def __init__(self, path: Path, timeout: float, startup_grace: float = 10.0) -> None:
        self.path = path
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout + startup_grace
        self._started = False

    def expired(self) -> bool:
        if not self._started and self.path.exists():
            self._started = True
            self.deadline = time.monotonic() + self.timeout
        return time.monotonic() >= self.deadline
