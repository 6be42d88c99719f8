"""What regional does to the Python worker process a task runs in (never the driver's).

**Freezing.** pyspark's daemon calls ``gc.collect()`` after each task a reused worker runs. A full collection
walks every tracked object, and a worker that has imported pyspark, pyarrow and regional's inputs and targets
holds about 55,000 of them: 23 ms per task on an idle core, about 60 ms per task and worker when every partition
of a 1,000-partition topic is active (py-spy, issue 31). Objects that exist once a worker's modules are imported
live as long as the worker, so they move to the permanent generation (``gc.freeze``), which collections skip.
Freezing also keeps what the current task holds at that moment; were any of it garbage in a cycle later, it
would never be collected. So it happens only when ``sys.modules`` has grown since the last freeze (a worker's
first tasks), a bounded cost. ``REGIONAL_GC_FREEZE=off`` turns it off (the benchmarks' comparison). The driver's
planner workers that build the sink for every epoch and commit it are such reused workers too: their collections
took 150 ms an epoch each (py-spy, 3 regions, 2026-11-28), about a fifth of a small epoch's Python time.

**A cut input.** When another operator of the task fails (a UDF raises), Spark fails the task and closes this
worker's socket; the sink's input ends early, the worker reports an error nobody reads and exits. Over a Unix
domain socket (regional's local sessions use them) that last write fails at once and pyspark's daemon prints a
``BrokenPipeError`` traceback for every such task; over TCP the write was buffered and nothing was printed.
The failure that matters is the other operator's, which Spark reports, so the exiting worker prints nothing more.
"""

from __future__ import annotations

import gc
import os
import sys

from regional.switches import switched_on

_modules_at_last_freeze = 0


def freeze_imports() -> None:
    """Called at the start of a task's read or write, in the Python worker."""
    global _modules_at_last_freeze
    modules = len(sys.modules)
    if modules == _modules_at_last_freeze:
        return
    _modules_at_last_freeze = modules
    if switched_on("REGIONAL_GC_FREEZE"):
        gc.freeze()


def quiet_after_cut_input() -> None:
    """Called when a sink task's input failed: this worker exits once pyspark has reported the error. Only in a
    Spark task's worker (elsewhere, a driver or a test, nothing changes); the file descriptor too, since pyspark
    puts its saved ``sys.stderr`` back when its worker logging captures a task's output."""
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = open(os.devnull, "w", encoding="utf-8")
