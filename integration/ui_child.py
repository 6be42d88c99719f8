"""A driver of its own with the Spark UI on, for the Spark UI tests: one regional query named ``ui_test`` whose
region ``b`` fails in the target while ``<work>/b_down`` exists.

Usage: python -m integration.ui_child <work> <ui port>

Regions: ``a``, ``b`` and two whose ids hold HTML (``EVIL_REGIONS``). Prints ``started <query id>``; stops the
query when ``<work>/stop`` appears (prints ``stopped``), and the session when ``<work>/exit`` appears.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyspark.sql import functions as F

import regional
from integration.helpers import add_epoch_of_files, regional_stream

# HTML that would run if a page spliced it in. No '=' in them: source=files refuses a region directory whose name
# looks like a partition directory (key=value).
EVIL_REGIONS = ['<script>Object.assign(window,{regionalPwned:2})',
                '"><svg><script>Object.assign(window,{regionalPwned:1})']
REGIONS = ["a", "b", *EVIL_REGIONS]
ROWS = 2  # each region's rows, one epoch's worth (maxRecordsPerRegion=2): b is the only one left after epoch 0


def wait_for(path: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.1)


def main() -> None:
    work, port = Path(sys.argv[1]), sys.argv[2]
    conf = {"spark.ui.enabled": "true", "spark.ui.port": port, "spark.port.maxRetries": "0",
            "spark.metrics.conf.*.sink.prometheusServlet.class": "org.apache.spark.metrics.sink.PrometheusServlet",
            "spark.metrics.conf.*.sink.prometheusServlet.path": "/metrics/prometheus"}
    spark = regional.local_spark("local[2,3]", "regional-ui-child", conf=conf)
    regional.register(spark)
    add_epoch_of_files(work / "in", REGIONS, "001", ROWS)
    df = regional_stream(spark, work / "in", work / "ck", maxRecordsPerRegion="2")
    query = (df.select("region", "offset", F.upper("value").alias("value")).writeStream.format("regional")
             .option("target", "python:integration.faults:FlakyDelta").option("path", str(work / "out"))
             .option("checkpointLocation", str(work / "ck")).option("failRegion", "b")
             .option("failWhileExists", str(work / "b_down")).queryName("ui_test").start())
    print(f"started {query.id}", flush=True)
    wait_for(work / "stop")
    query.stop()
    print("stopped", flush=True)
    wait_for(work / "exit")
    spark.stop()


if __name__ == "__main__":
    main()
