"""A script as a user writes it: register, run a regional query, and end without stopping anything.

Usage: python -m integration.exit_child <in> <out> <checkpoint>
"""

from __future__ import annotations

import sys
from pathlib import Path

import regional
from integration.helpers import add_epoch_of_files, regional_stream, start_to_delta


def main() -> None:
    inp, out, ck = sys.argv[1:4]
    add_epoch_of_files(Path(inp), ["a", "b"], "001", 5)
    spark = regional.local_spark("local[2,3]", "regional-exit-child")
    regional.register(spark)
    query = start_to_delta(regional_stream(spark, Path(inp), Path(ck)), Path(out), Path(ck))
    query.processAllAvailable()
    print("child done", flush=True)  # and the script ends here: no query.stop(), no spark.stop()


if __name__ == "__main__":
    main()
