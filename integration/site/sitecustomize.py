"""Test runs only: integration/conftest.py puts this directory on PYTHONPATH, which every Python process Spark
starts inherits (workers, planner workers, the streaming source runner, child drivers).

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on its Python workers' path. Python
compiles modules imported from a zip from source in every process (zipimport keeps no bytecode): about 1.5 to 2 s
of CPU for each worker process (py-spy, 2026-11-28), and the test run starts hundreds. With pip's pyspark,
``SPARK_HOME`` is the installed package, so those zips hold the same files as site-packages, whose bytecode is
cached: the zips are taken off the path when they belong to the pyspark (or the py4j) installed beside this
interpreter. Elsewhere (a Spark distribution's own ``SPARK_HOME``) nothing changes.
"""

from __future__ import annotations

import os
import sys


def _installed(package: str) -> str | None:
    """The directory of ``package`` in this interpreter's site-packages, without importing it."""
    for entry in sys.path:
        if entry.endswith("site-packages") and os.path.isfile(os.path.join(entry, package, "__init__.py")):
            return os.path.join(entry, package)
    return None


def _prefer_installed_pyspark() -> None:
    pyspark = _installed("pyspark")
    if pyspark is None:
        return
    lib = os.path.join(pyspark, "python", "lib")
    for entry in list(sys.path):
        name = os.path.basename(entry)
        if os.path.dirname(entry) != lib:
            continue
        if name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith("-src.zip") and _installed("py4j")):
            sys.path.remove(entry)


_prefer_installed_pyspark()
