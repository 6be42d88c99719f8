"""A notebook's session, built without regional's jar; then register. Prints what register logged."""

from __future__ import annotations

import logging
import os
import sys

from pyspark.sql import SparkSession

import regional


def main() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("regional").addHandler(handler)
    spark = (SparkSession.builder.master("local[2,3]").config("spark.ui.enabled", "false")
             .config("spark.python.unix.domain.socket.enabled", "true").getOrCreate())  # its own line otherwise
    regional.register(spark)
    for line in records:
        print(f"LOGGED: {line}")
    print(f"STATE: {regional.shim_state(spark)}")
    spark.stop()


if __name__ == "__main__":
    main()
