"""One driver of the campaign: a regional query from ``source`` into ``target`` until no input is left.

Usage: python -m reliability.child '<json of Query>'. The campaign SIGKILLs it at random moments.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

from pyspark.sql import functions as F

import regional

TARGETS = {"delta": "delta", "python": "python:regional.testing.committer:EpochFilesTarget", "postgres": "postgres"}


@dataclass(frozen=True)
class Query:
    source: str  # files | kafka
    target: str  # delta | python | postgres
    checkpoint: str
    input: str  # the files source's directory, or the Kafka topic
    out: str = ""  # the Delta table's or the committer's directory
    bootstrap: str = ""
    url: str = ""  # PostgreSQL
    table: str = ""
    fail_share: float = 0.0
    max_per_region: int = 10
    master: str = "local[2,3]"

    def args(self) -> list[str]:
        return ["reliability.child", json.dumps(asdict(self))]


def run(q: Query) -> None:
    spark = regional.local_spark(q.master, "regional-reliability")
    regional.register(spark)
    reader = (spark.readStream.format("regional").option("source", q.source)
              .option("checkpointLocation", q.checkpoint).option("maxRecordsPerRegion", str(q.max_per_region)))
    if q.source == "files":
        reader = reader.option("path", q.input)
    else:
        reader = (reader.option("kafka.bootstrap.servers", q.bootstrap).option("subscribe", q.input)
                  .option("startingOffsets", "earliest"))
    df = reader.load().select("region", "offset", F.upper(F.col("value").cast("string")).alias("value"))
    writer = (df.writeStream.format("regional").option("checkpointLocation", q.checkpoint)
              .option("keepRegionColumns", "true").option("target", "python:reliability.faults:Flaky")
              .option("inner", TARGETS[q.target]).option("failShare", str(q.fail_share)))
    if q.target == "postgres":
        writer = writer.option("url", q.url).option("table", q.table)
    else:
        writer = writer.option("path", q.out)
    query = writer.start()
    query.processAllAvailable()
    query.stop()
    spark.stop()
    print("child finished", flush=True)


if __name__ == "__main__":
    run(Query(**json.loads(sys.argv[1])))
