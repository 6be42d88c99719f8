"""A regional query over Spark Connect, from a client process with no JVM: files a, b, c into Delta through a
target whose region b fails in the listed epochs, a UDF that raises ValueError on the listed poison values, dead
letters to a Delta table (deadLetterOn=ValueError); it runs until the store holds the asked number of epochs, then
stops gracefully with ``regional.stop``.

Usage: python -m integration.connect_child <sc://url | local[N,F]> <work dir> <epochs> <fail epochs> <poison,values>
       [--bounded]   (Trigger.AvailableNow: ends by itself once everything is published)

Prints ``CHILD-RESULT <json>``: the stop's outcome, the status it read, and the JVMs this process started.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

import regional
from integration.helpers import poison_udf
from regional.spark.session import is_connect
from regional.testing.processes import descendants, process_table


def main() -> None:
    url, work, epochs, fail_epochs, poison = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], \
        set(filter(None, sys.argv[5].split(",")))
    bounded = "--bounded" in sys.argv[6:]
    inp, out, ck, dlq = work / "in", work / "out", work / "ck", work / "dead-letters"
    builder = SparkSession.builder.remote(url)
    # remote("local[...]"): pyspark starts the Connect server in this process, with regional's conf
    spark = (regional.configure(builder) if url.startswith("local") else builder).getOrCreate()
    assert is_connect(spark), type(spark)
    spark.conf.set("spark.regional.deadLetterPath", str(dlq))  # the conf route, read by the server's source
    # No retries: the shipped 4, a minute apart, take minutes per poison record (issue 45).
    spark.conf.set("spark.regional.deadLetterRetries", "0")
    # The poison UDF's ValueError is the record's fault: dead-lettered on its first failure alone, from the failure
    # records of the server's shim (the evidence rule's epochs and waits are test_dead_letters' to test).
    spark.conf.set("spark.regional.deadLetterOn", "ValueError")
    regional.register(spark)
    parse = poison_udf(poison)
    df = (spark.readStream.format("regional").option("source", "files").option("path", str(inp))
          .option("maxRecordsPerRegion", "3").load()
          .select("region", "offset", parse("value").alias("value")))
    writer = (df.writeStream.format("regional").option("target", "python:integration.faults:FlakyDelta")
              .option("path", str(out)).option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
              .option("failRegion", "b").option("failEpochs", fail_epochs)
              .option("maxDeadLettersPerEpoch", "5"))  # a setting on writeStream: the shim records it at start
    if bounded:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    stopped_whole = None
    if bounded:
        query.awaitTermination(300)
    else:
        deadline = time.monotonic() + 300
        while not _recorded(ck, epochs):
            if not query.isActive or time.monotonic() > deadline:
                raise SystemExit(f"query ended or stalled: {query.exception()}")
            time.sleep(0.2)
        stopped_whole = regional.stop(query, timeout=120)
    exception = query.exception()
    status = regional.status(ck)
    jvms = [p.cmdline for p in descendants(process_table(), os.getpid()) if p.name == "java"]
    print("CHILD-RESULT " + json.dumps({
        "stopped_whole": stopped_whole, "exception": str(exception) if exception else None,
        "states": {r: s.state.value for r, s in status.regions.items()}, "epochs": len(status.epochs),
        "jvms": jvms, "py4j": _has_py4j_gateway()}), flush=True)
    spark.stop()


def _has_py4j_gateway() -> bool:
    try:
        from pyspark import SparkContext
    except ImportError:  # pyspark-client: no classic pyspark at all
        return False
    return SparkContext._jvm is not None


def _recorded(ck: Path, epochs: int) -> bool:
    return (ck / "regional" / "epochs").is_dir() and len(regional.status(ck).epochs) >= epochs


if __name__ == "__main__":
    main()
