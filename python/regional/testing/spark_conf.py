"""The Spark conf of the test run's own JVMs: a ``spark-defaults.conf`` that every SparkSession the tests start
reads (the shared one, child drivers, Connect servers, a standalone cluster's executors), through
``SPARK_CONF_DIR``, which child processes inherit. It changes how fast the JVM runs a few records, never what
Spark or regional does with them (docs/testing.md, "Two workers")."""

from __future__ import annotations

import os
from pathlib import Path

# The tests' queries read a handful of records each, on two cores shared by two pytest workers: the run is
# CPU-bound. Measured on integration/test_regional_epochs.py alone (2 cores, 2026-11-28): 207 s of CPU in 126 s
# of wall time with Spark's defaults, 148 s in 99 s with these. Most of what they save is compilation: C2's
# (a JVM's second JIT tier, worth it for long hot loops, which tests have none of) and Janino's (Spark's
# generated code, one class per query shape and per task's projection, for a few rows each).
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUICK_SPARK_DEFAULTS: dict[str, str] = {
    # defaultJavaOptions, not extraJavaOptions: regional.configure() sets the latter (its log4j2 file), and
    # spark-submit puts the two together
    "spark.driver.defaultJavaOptions": JVM_OPTIONS,
    "spark.executor.defaultJavaOptions": JVM_OPTIONS,
    # Interpreted expressions, Spark's own fallback when code generation fails: the same results, without a
    # compiler run per query shape
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    # delta-spark rebuilds a table's state in this many tasks (default 50) each time a test reads a table back;
    # the tests' tables have a few files each
    "spark.databricks.delta.snapshotPartitions": "2",
}


def use_quick_spark_defaults(directory: Path) -> Path:
    """Writes ``QUICK_SPARK_DEFAULTS`` to ``directory/spark-defaults.conf`` and points ``SPARK_CONF_DIR`` at it,
    for this process and every process it starts. Call it before the first SparkSession."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "spark-defaults.conf"
    path.write_text("".join(f"{key} {value}\n" for key, value in QUICK_SPARK_DEFAULTS.items()), encoding="utf-8")
    os.environ["SPARK_CONF_DIR"] = str(directory)
    return path
