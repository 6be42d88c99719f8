"""Spark's own Kafka source (spark-sql-kafka-0-10), the reference of the Kafka differential tests, in a process of
its own: the integration run's SparkSession has no Kafka connector, and a session's jars are fixed at its start.

    python -m integration.stock_kafka <spec.json>

``spec.json``: ``{"runs": [{"out": dir, "ck": dir, "options": {...}}]}``. Each run is one Trigger.AvailableNow query
of ``spark.readStream.format("kafka")`` with those options into parquet at ``out``; the file ``<out>.result`` then
says ``ok`` or the query's error. A run with ``"sink": {"read": {...}, "exprs": [...], "write": {...}}`` is Spark's
Kafka *sink* instead: a batch read of Kafka (``read``'s options), ``selectExpr(*exprs)``, written with
``df.write.format("kafka")`` (``write``'s options), the writer Spark's streaming Kafka sink runs too. The
connector's jars come from Maven Central once (``regional.testing.maven``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyspark

SPARK_LINE = ".".join(pyspark.__version__.split(".")[:2])
PACKAGE = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_LINE}.0"  # as benchmarks.common.KAFKA_PACKAGE
# The connector and what it adds to pyspark's own jars (its other dependencies are pyspark's, at other versions).
OWN_JARS = ("spark-sql-kafka-0-10", "spark-token-provider-kafka-0-10", "kafka-clients", "commons-pool2")


def connector_jars() -> list[str]:
    from regional.testing import maven

    lib = maven.fetch(f"spark-sql-kafka-{SPARK_LINE}.0", [PACKAGE])
    return sorted(str(j) for j in lib.glob("*.jar") if j.name.startswith(OWN_JARS))


def main(spec_path: str) -> None:
    from pyspark.sql import SparkSession

    spec = json.loads(Path(spec_path).read_text())
    spark = (SparkSession.builder.master("local[2]").appName("stock-kafka")
             .config("spark.jars", ",".join(connector_jars())).config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for run in spec["runs"]:
            result = Path(run["out"] + ".result")
            if "sink" in run:
                sink = run["sink"]
                try:
                    (spark.read.format("kafka").options(**sink["read"]).load().selectExpr(*sink["exprs"])
                     .write.format("kafka").options(**sink["write"]).save())
                    result.write_text("ok")
                except Exception as exc:
                    result.write_text(f"failed: {exc}")
                continue
            reader = spark.readStream.format("kafka")
            for key, value in run["options"].items():
                reader = reader.option(key, value)
            try:
                query = (reader.load().writeStream.format("parquet").option("path", run["out"])
                         .option("checkpointLocation", run["ck"]).trigger(availableNow=True).start())
                query.awaitTermination()
                result.write_text("ok")
            except Exception as exc:
                result.write_text(f"failed: {exc}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
