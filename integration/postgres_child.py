"""Runs one regional query into PostgreSQL until no input is left; the crash tests kill it.

Usage: python -m integration.postgres_child <in> <checkpoint> <url> <table> [--end-without-stopping]

With --end-without-stopping the script ends as a user's may: its query still running, without ``query.stop()`` or
``spark.stop()`` (the listener ``register`` adds must neither hang the exit nor print py4j stack traces).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import functions as F

import regional
from integration.helpers import regional_stream


def main() -> None:
    inp, ck = Path(sys.argv[1]), Path(sys.argv[2])
    url, table = sys.argv[3], sys.argv[4]
    spark = regional.local_spark("local[2,3]", "regional-postgres-child")
    regional.register(spark)
    df = regional_stream(spark, inp, ck, maxRecordsPerRegion="7")
    query = (df.select("region", "offset", F.upper("value").alias("value")).writeStream.format("regional")
             .option("target", "postgres").option("url", url).option("table", table)
             .option("keepRegionColumns", "true").option("checkpointLocation", str(ck)).start())
    query.processAllAvailable()
    if "--end-without-stopping" in sys.argv[5:]:
        print("child finished", flush=True)  # and the script ends here: no query.stop(), no spark.stop()
        return
    query.stop()
    print("child finished", flush=True)


if __name__ == "__main__":
    main()
