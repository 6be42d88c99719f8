"""Connecting ``regional`` to a SparkSession: ``register``, and a local session for demos and tests."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from regional.config import CONF_PREFIX, RegionalPolicy, merge_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("regional")

# The Delta JVM artifact matching the pinned pyspark and delta-spark (see setup.cfg).
DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"


def register(spark: SparkSession) -> None:
    """Register the ``regional`` data source with this session's ``spark.regional.*`` defaults.

    Calling it again is harmless, and picks up conf changed since.
    """
    from regional.source import RegionalDataSource

    conf = {k: v for k, v in spark.conf.getAll.items() if k.lower().startswith(CONF_PREFIX)}
    policy = RegionalPolicy.from_options(merge_options(conf, {}))  # bad conf fails here, not in a task
    _check_python(spark)
    _check_task_retries(spark, policy)
    source = type("RegionalDataSource", (RegionalDataSource,), {"conf_defaults": conf})
    spark.dataSource.register(source)


def _check_python(spark: SparkSession) -> None:
    worker = spark.sparkContext.pythonExec
    if worker and os.path.realpath(_which(worker)) != os.path.realpath(sys.executable):
        log.warning(
            "regional: Python workers run %s but this driver runs %s; set PYSPARK_PYTHON=%s "
            "before the session starts, or workers may lack pyarrow and regional",
            worker, sys.executable, sys.executable,
        )


def _which(program: str) -> str:
    if os.path.isabs(program):
        return program
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(directory, program)
        if os.path.isfile(candidate):
            return candidate
    return program


def task_max_failures(spark: SparkSession) -> int:
    """Attempts Spark gives a task: ``local[N,F]`` sets F; plain ``local[N]`` gives one."""
    master = spark.sparkContext.master
    match = re.fullmatch(r"local\[[^,\]]+,\s*(\d+)\]", master)
    if match:
        return int(match.group(1))
    if master.startswith("local"):
        return 1
    return int(spark.conf.get("spark.task.maxFailures", "4") or 4)


def _check_task_retries(spark: SparkSession, policy: RegionalPolicy) -> None:
    attempts = task_max_failures(spark)
    if policy.enabled and attempts <= policy.region_attempts:
        log.warning(
            "regional: Spark gives each task %d attempt(s) (%s) but spark.regional.regionAttempts=%d; "
            "failures upstream of the sink cannot be isolated to their region. Use master local[N,%d] "
            "or set spark.task.maxFailures to at least %d",
            attempts, spark.sparkContext.master, policy.region_attempts,
            policy.region_attempts + 1, policy.region_attempts + 1,
        )


def local_spark(master: str = "local[4,4]", app_name: str = "regional",
                conf: Mapping[str, str] | None = None) -> SparkSession:
    """A local SparkSession with Delta Lake and this interpreter for Python workers."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.jars.packages", DELTA_PACKAGE)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
