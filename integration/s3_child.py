"""Runs one regional query with its checkpoint on S3 (s3proxy) until no input is left; tests kill it.

Usage: python -m integration.s3_child <in> <out> <s3a checkpoint> <endpoint> <marker>

Region b's target is down while the file <marker> exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

import regional
from integration.helpers import regional_stream, start_to_delta
from regional.testing.s3_server import spark_conf


def main() -> None:
    inp, out, ck, endpoint, b_down = sys.argv[1:6]
    spark = regional.local_spark("local[2,3]", "regional-s3-child", conf=spark_conf(endpoint))
    regional.register(spark)
    query = start_to_delta(regional_stream(spark, Path(inp), ck, maxRecordsPerRegion="4"), Path(out), ck,
                           target="python:integration.faults:FlakyDelta", failRegion="b", failWhileExists=b_down)
    query.processAllAvailable()
    query.stop()
    print("child finished", flush=True)


if __name__ == "__main__":
    main()
