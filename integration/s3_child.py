"""Runs one regional query with its checkpoint on S3 (s3proxy) until no input is left; tests kill it.

Usage: python -m integration.s3_child <in> <out> <s3a checkpoint> <endpoint> <marker> [<dead letters> <poison>]

Region b's target is down while the file <marker> exists. <in> may be an s3a:// directory, <out> and <dead
letters> s3a:// tables. With
<poison> (values, comma-separated), a UDF raises ValueError on those values and the query isolates them into <dead
letters> (deadLetterOn=ValueError: on their first failure alone).
At the end the child prints the rows delta-spark reads from <out> over s3a:// ("delta-spark rows: N").
"""

from __future__ import annotations

import sys

from pyspark.sql import functions as F

import regional
from integration.helpers import poison_udf, regional_stream
from regional.testing.s3_server import spark_conf


def main() -> None:
    inp, out, ck, endpoint, b_down = sys.argv[1:6]
    dead_letters = sys.argv[6] if len(sys.argv) > 6 else ""
    poison = set(sys.argv[7].split(",")) if len(sys.argv) > 7 and sys.argv[7] else set()
    # No retries: the shipped 4, a minute apart, take minutes per poison record (issue 45).
    spark = regional.local_spark("local[2,3]", "regional-s3-child",
                                 conf={**spark_conf(endpoint), "spark.regional.deadLetterRetries": "0"})
    regional.register(spark)
    df = regional_stream(spark, inp, ck, maxRecordsPerRegion="4")
    value = poison_udf(poison)("value") if poison else F.upper("value")
    writer = (df.select("region", "offset", value.alias("value")).writeStream.format("regional")
              .option("target", "python:integration.faults:FlakyDelta").option("path", out)
              .option("checkpointLocation", ck).option("keepRegionColumns", "true")
              .option("failRegion", "b").option("failWhileExists", b_down))
    if dead_letters:
        # The poison UDF raises ValueError: the record's fault by name, dead-lettered on its first failure alone (what
        # is tested here is S3; the evidence rule is test_dead_letters' poison test's).
        writer = writer.option("deadLetterPath", dead_letters).option("deadLetterOn", "ValueError")
    query = writer.start()
    query.processAllAvailable()
    query.stop()
    print(f"delta-spark rows: {spark.read.format('delta').load(out).count()}", flush=True)
    print("child finished", flush=True)


if __name__ == "__main__":
    main()
