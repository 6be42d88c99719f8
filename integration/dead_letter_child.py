"""Runs one regional query with poison records and a dead-letter table until no input is left; the crash
test kills it while it isolates them.

Usage: python -m integration.dead_letter_child <in> <out> <checkpoint> <dead letters> <poison value>...
"""

from __future__ import annotations

import sys
from pathlib import Path

import regional
from integration.helpers import poison_udf, regional_stream


def main() -> None:
    inp, out, ck, dlq = (Path(a) for a in sys.argv[1:5])
    poison = set(sys.argv[5:])
    # No retries: the shipped 4, a minute apart, take minutes per poison record (issue 45).
    spark = regional.local_spark("local[2,3]", "regional-dead-letter-child",
                                 {"spark.regional.deadLetterRetries": "0"})
    regional.register(spark)

    parse = poison_udf(poison)
    df = regional_stream(spark, inp, ck)
    query = (df.select("region", "offset", parse("value").alias("value")).writeStream.format("regional")
             .option("target", "delta").option("path", str(out)).option("checkpointLocation", str(ck))
             .option("keepRegionColumns", "true").option("deadLetterPath", str(dlq)).start())
    query.processAllAvailable()
    query.stop()
    print("child finished", flush=True)


if __name__ == "__main__":
    main()
