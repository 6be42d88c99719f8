"""Python workers: keep the collection pyspark runs after every task cheap.

pyspark's daemon calls ``gc.collect()`` after each task a reused worker runs. A full collection walks every
tracked object, and a worker that has imported pyspark, pyarrow and regional's inputs and targets holds about
55,000 of them: 23 ms per task on an idle core, about 60 ms per task and worker when every partition of a
1,000-partition topic is active (py-spy, issue 31). Objects that exist once a worker's modules are imported
live as long as the worker, so they move to the permanent generation (``gc.freeze``), which collections skip.

Freezing also keeps what the current task holds at that moment; were any of it garbage in a cycle later, it
would never be collected. So it happens only when ``sys.modules`` has grown since the last freeze (a worker's
first tasks), a bounded cost. ``REGIONAL_GC_FREEZE=off`` turns it off (the benchmarks' comparison).
"""

from __future__ import annotations

import gc
import os
import sys

_modules_at_last_freeze = 0


def freeze_imports() -> None:
    """Called at the start of a task's read or write, in the Python worker."""
    global _modules_at_last_freeze
    modules = len(sys.modules)
    if modules == _modules_at_last_freeze:
        return
    _modules_at_last_freeze = modules
    if os.environ.get("REGIONAL_GC_FREEZE", "on").strip().lower() not in ("off", "false", "0", "no"):
        gc.freeze()
