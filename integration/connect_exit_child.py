"""A Spark Connect client that used regional and ends without ``spark.stop()``: files into Delta with
Trigger.AvailableNow, then the end of the script. The process must exit as a client without regional would
(pyspark's listener bus, started by regional's listener, is not a daemon thread).

Usage: python -m integration.connect_exit_child <sc://url> <work dir> [--atexit]   (work dir holds in/<region>/...)
--atexit: detach regional's listener with atexit, as before the fix (a probe that it then never exits)
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import SparkSession

import regional


def main() -> None:
    url, work = sys.argv[1], Path(sys.argv[2])
    if "--atexit" in sys.argv[3:]:
        import atexit

        from regional.spark import session

        session._at_thread_exit = atexit.register  # type: ignore[assignment]
    spark = SparkSession.builder.remote(url).getOrCreate()
    regional.register(spark)
    query = (spark.readStream.format("regional").option("source", "files").option("path", str(work / "in")).load()
             .writeStream.format("regional").option("target", "delta").option("path", str(work / "out"))
             .option("checkpointLocation", str(work / "ck")).option("keepRegionColumns", "true")
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    print(f"CHILD-DONE active={query.isActive}", flush=True)
    # No spark.stop(): the script ends here, and so must the process.


if __name__ == "__main__":
    main()
