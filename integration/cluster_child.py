"""Runs one regional query on a Spark standalone cluster until no input is left; the cluster test kills
executors and workers under it.

Usage: python -m integration.cluster_child <master> <in> <out> <checkpoint> <ms per record>
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyspark.sql import functions as F

import regional
from integration.helpers import ROOT, regional_stream, start_to_delta


def main() -> None:
    master, inp, out, ck = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    delay = float(sys.argv[5]) / 1000
    spark = regional.local_spark(master, "regional-cluster-child", {
        "spark.executorEnv.PYTHONPATH": str(ROOT), "spark.executor.memory": "512m", "spark.cores.max": "2",
        "spark.task.maxFailures": "4"})
    regional.register(spark)

    @F.udf("string")
    def slow_upper(value: str) -> str:
        time.sleep(delay)  # epochs long enough that a killed executor is running tasks
        return value.upper()

    df = regional_stream(spark, inp, ck, maxRecordsPerRegion="5")
    query = start_to_delta(df.select("region", "offset", slow_upper("value").alias("value")), out, ck,
                           regionAttempts="3")
    query.processAllAvailable()
    query.stop()
    print("child finished", flush=True)


if __name__ == "__main__":
    main()
