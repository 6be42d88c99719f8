"""A session whose shim jar lacks ``setting-keys.txt`` (a jar from an older build), over a checkpoint that holds
an earlier run's ``write-options.json``: the shim cannot record this run's writeStream settings.

Usage: python -m integration.stale_options_child <shim jar> <work dir>
       python -m integration.stale_options_child --unregistered <work dir>
           (no shim, and the data source registered without regional.register: no listener records them)

Prints ``CHILD-RESULT <json>``: the query's exception, and whether the earlier run's record is still there.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import regional
from regional.spark.datasource import RegionalDataSource
from regional.spark.shim import EXTENSION


def main() -> None:
    jar, work = sys.argv[1], Path(sys.argv[2])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.master("local[2,3]").config("spark.ui.enabled", "false")
    if jar == "--unregistered":
        spark = builder.getOrCreate()
        spark.dataSource.register(RegionalDataSource)
    else:
        spark = builder.config("spark.jars", jar).config("spark.sql.extensions", EXTENSION).getOrCreate()
        regional.register(spark)
    query = (spark.readStream.format("regional").option("source", "files").option("path", str(work / "in"))
             .option("checkpointLocation", str(work / "ck")).load()
             .writeStream.format("regional").option("target", "delta").option("path", str(work / "out"))
             .option("checkpointLocation", str(work / "ck")).option("maxDeadLettersPerEpoch", "7")
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(180)
    except Exception:  # the query's own failure, read below
        pass
    exception = query.exception()
    print("CHILD-RESULT " + json.dumps({
        "exception": str(exception) if exception else None,
        "earlier_record": (work / "ck" / "regional" / "write-options.json").exists(),
        "published": (work / "out").exists()}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
