"""Runs one regional query on a standalone cluster whose workers cannot see this driver's disk: the input files,
the checkpoint and the Delta table on S3. Fails if an executor sees <sentinel> (a file of the driver's).

Usage: python -m integration.no_shared_disk_child <master> <s3a input> <s3a checkpoint> <s3a table> <endpoint>
       <sentinel>
"""

from __future__ import annotations

import os
import sys
import time

from pyspark.sql import functions as F

import regional
from integration.helpers import ROOT
from regional.testing.s3_server import spark_conf


def main() -> None:
    master, inp, ck, out, endpoint, sentinel = sys.argv[1:7]
    spark = regional.local_spark(master, "regional-no-shared-disk", {
        **spark_conf(endpoint), "spark.executorEnv.PYTHONPATH": str(ROOT), "spark.executor.memory": "512m",
        "spark.cores.max": "2", "spark.task.maxFailures": "4"})
    regional.register(spark)
    seen = spark.sparkContext.parallelize([0], 1).map(lambda _: os.path.exists(sentinel)).collect()
    if seen[0]:
        raise SystemExit(f"an executor sees {sentinel}, a file of the driver's: the workers share its disk")

    @F.udf("string")
    def slow_upper(value: str) -> str:
        time.sleep(0.02)  # epochs long enough that a killed executor is running tasks
        return value.upper()

    df = (spark.readStream.format("regional").option("source", "files").option("path", inp)
          .option("maxRecordsPerRegion", "10").option("checkpointLocation", ck).load())
    query = (df.select("region", "offset", slow_upper("value").alias("value")).writeStream.format("regional")
             .option("target", "delta").option("path", out).option("checkpointLocation", ck)
             .option("keepRegionColumns", "true").option("regionAttempts", "3").start())
    query.processAllAvailable()
    query.stop()
    print("child finished", flush=True)


if __name__ == "__main__":
    main()
