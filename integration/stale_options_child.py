"""Runs whose writeStream settings are not recorded at their start.

Usage: python -m integration.stale_options_child <shim jar> <work dir>
           a session whose shim jar lacks ``setting-keys.txt`` (a jar from an older build), over a checkpoint
           that holds an earlier run's ``write-options.json``: the shim cannot record this run's settings;
       python -m integration.stale_options_child --unregistered <work dir>
           no shim, and the data source registered without regional.register: no listener records them;
       python -m integration.stale_options_child --second-run-unregistered <work dir>
           a first run recorded by regional.register's listener (no shim) that publishes, then more input and a
           second run after regional.register's listener is removed: nothing records its settings.

Prints ``CHILD-RESULT <json>``: the (last) query's exception, whether an untaken record is there, whether
anything was published, and how many epochs Spark's offset log holds after each run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import regional
from integration.helpers import add_epoch_of_files
from regional.spark.datasource import RegionalDataSource
from regional.spark.shim import EXTENSION


def run(spark: SparkSession, work: Path, max_dead_letters: str) -> str | None:
    query = (spark.readStream.format("regional").option("source", "files").option("path", str(work / "in"))
             .option("checkpointLocation", str(work / "ck")).load()
             .writeStream.format("regional").option("target", "delta").option("path", str(work / "out"))
             .option("checkpointLocation", str(work / "ck")).option("maxDeadLettersPerEpoch", max_dead_letters)
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(180)
    except Exception:  # the query's own failure, read below
        pass
    exception = query.exception()
    return str(exception) if exception else None


def planned_epochs(work: Path) -> int:
    offsets = work / "ck" / "offsets"
    return len([p for p in offsets.iterdir() if p.name.isdigit()]) if offsets.is_dir() else 0


def main() -> None:
    mode, work = sys.argv[1], Path(sys.argv[2])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.master("local[2,3]").config("spark.ui.enabled", "false")
    planned = []
    if mode == "--unregistered":
        spark = builder.getOrCreate()
        spark.dataSource.register(RegionalDataSource)
        exception = run(spark, work, "7")
    elif mode == "--second-run-unregistered":
        spark = builder.getOrCreate()
        regional.register(spark)
        first = run(spark, work, "1")
        assert first is None, first
        planned.append(planned_epochs(work))
        add_epoch_of_files(work / "in", ["a", "b"], "002", 2)
        listener = regional.listener_for(spark)
        assert listener is not None
        spark.streams.removeListener(listener)  # nothing records the second run's settings
        exception = run(spark, work, "7")
    else:
        spark = builder.config("spark.jars", mode).config("spark.sql.extensions", EXTENSION).getOrCreate()
        regional.register(spark)
        exception = run(spark, work, "7")
    planned.append(planned_epochs(work))
    print("CHILD-RESULT " + json.dumps({
        "exception": exception, "planned": planned,
        "earlier_record": (work / "ck" / "regional" / "write-options.json").exists(),
        "published": (work / "out").exists()}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
