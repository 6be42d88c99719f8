"""A regional query whose UDF raises on one record of region c: c is quarantined, the rest publish.

Usage: python -m integration.poison_child <work dir>
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import functions as F

import regional
from integration.helpers import add_epoch_of_files, regional_stream, wait_for_epochs


def parse_value(value: str) -> str:
    if value == "c-001-1":
        raise ValueError(f"cannot parse {value}")
    return value.upper()


def main() -> None:
    work = Path(sys.argv[1])
    inp, out, ck = work / "in", work / "out", work / "ck"
    add_epoch_of_files(inp, ["a", "b", "c"], "001", 4)
    spark = regional.local_spark("local[2,3]", "regional-poison-child")
    regional.register(spark)
    parse = F.udf(parse_value, "string")
    query = (regional_stream(spark, inp, ck, maxRecordsPerRegion="2")
             .select("region", "offset", parse("value").alias("value"))
             .writeStream.format("regional").option("target", "delta").option("path", str(out))
             .option("checkpointLocation", str(ck)).start())
    wait_for_epochs(query, ck, 3)
    query.stop()
    print(f"child done: c is {regional.status(ck).regions['c'].state.value}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
