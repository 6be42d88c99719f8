"""Runs one regional query until no input is left; the crash test kills it mid-epoch.

Usage: python -m integration.crash_child <in> <out> <checkpoint> <marker>

Region b's target is down while the file <marker> exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

import regional
from integration.helpers import regional_stream, start_to_delta


def main() -> None:
    inp, out, ck, b_down = (Path(a) for a in sys.argv[1:5])
    spark = regional.local_spark("local[2,3]", "regional-crash-child")
    regional.register(spark)
    query = start_to_delta(regional_stream(spark, inp, ck, maxRecordsPerRegion="4"), out, ck,
                           target="python:integration.faults:FlakyDelta", failRegion="b", failWhileExists=str(b_down))
    query.processAllAvailable()
    query.stop()
    print("child finished", flush=True)


if __name__ == "__main__":
    main()
