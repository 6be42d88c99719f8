"""A script as a person writes one, run in a terminal of its own: files into Delta, ``awaitTermination()``.

Usage: python -m integration.console_child <fail|wait> <work dir>
- fail: once the first epoch is recorded (one record a region an epoch), the file is deleted before all its records
  are published, so the next plan fails with regional's error: the script ends on the uncaught exception.
- wait: it runs until interrupted (the test sends Ctrl-C to its process group, as a terminal does); each epoch
  takes 2 s more in a UDF, so that the signal finds one in flight.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyspark.sql import functions as F

import regional


def main() -> None:
    mode, work = sys.argv[1], Path(sys.argv[2])
    spark = regional.local_spark()
    regional.register(spark)
    source = work / "in" / "a"
    source.mkdir(parents=True, exist_ok=True)
    (source / "001.txt").write_text("".join(f"a-{i}\n" for i in range(5)))
    df = (spark.readStream.format("regional").option("source", "files").option("path", str(work / "in"))
          .option("checkpointLocation", str(work / "ck")).option("maxRecordsPerRegion", "1").load())
    if mode == "wait":
        slow = F.udf(lambda value: time.sleep(2) or value, "string")
        df = df.select("region", "offset", slow("value").alias("value"))
    query = (df.writeStream.format("regional").option("target", "delta").option("path", str(work / "out"))
             .option("checkpointLocation", str(work / "ck")).option("keepRegionColumns", "true")
             .trigger(processingTime="1 second").start())
    deadline = time.monotonic() + 240
    while not regional.status(work / "ck").epochs and time.monotonic() < deadline:
        time.sleep(0.3)
    print("CHILD-RUNNING", flush=True)
    if mode == "fail":
        (source / "001.txt").unlink()
    query.awaitTermination()


if __name__ == "__main__":
    main()
