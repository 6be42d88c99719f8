"""``python -m regional.demo``: a regional query whose target fails for one region, then heals.

Four regions of text files flow into a Delta table. The target of region
``us-east`` is down for epochs 1 and 2: those epochs publish the other regions
and ``us-east`` falls back, referencing the last epoch that committed it.
Then it heals, catches up, and the table is checked record by record.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

import regional
from regional.cli.status import render
from regional.store.model import describe
from regional.targets.delta import DeltaTarget

REGIONS = ["ap-south", "eu-west", "sa-east", "us-east"]
FAILING = "us-east"
DOWN_EPOCHS = range(1, 3)


class FlakyShard(DeltaTarget):
    """Delta, except that the shard behind ``us-east`` is down during epochs 1-2."""

    def prepare(self, epoch: int, region: str, batches: Iterator[pa.RecordBatch]) -> Any:
        if region == FAILING and epoch in DOWN_EPOCHS:
            raise ConnectionError(f"shard for {region} unreachable")
        return super().prepare(epoch, region, batches)


def write_input(root: Path, round_: int, rows: int) -> dict[str, list[str]]:
    added = {}
    for region in REGIONS:
        directory = root / region
        directory.mkdir(parents=True, exist_ok=True)
        values = [f"{region} order {round_}-{i}" for i in range(rows)]
        tmp = directory / f".{round_:04d}.txt"
        tmp.write_text("".join(v + "\n" for v in values))
        os.replace(tmp, directory / f"{round_:04d}.txt")  # visible only when complete
        added[region] = values
    return added


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="work directory (default: a new temporary one)")
    args = parser.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="regional-demo-"))
    inp, out, ck = work / "in", work / "out", work / "checkpoint"
    logging.basicConfig(level=logging.ERROR)

    print(f"regional demo in {work}: {len(REGIONS)} regions -> Delta; target of {FAILING!r} down in epochs 1-2\n")
    spark = regional.local_spark("local[2,3]", "regional-demo")
    regional.register(spark)
    from pyspark.sql import functions as F

    expected: dict[str, list[str]] = {r: [] for r in REGIONS}
    events = (spark.readStream.format("regional").option("source", "files").option("path", str(inp))
              .option("checkpointLocation", str(ck)).option("maxRecordsPerRegion", "20").load())
    query = (events.select("region", "offset", F.upper("value").alias("value"))
             .writeStream.format("regional").option("target", "python:regional.demo:FlakyShard")
             .option("path", str(out)).option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
             .start())
    shown = 0
    try:
        for round_, count in enumerate((60, 30, 30)):
            for region, values in write_input(inp, round_, count).items():
                expected[region].extend(v.upper() for v in values)
            query.processAllAvailable()
            for record in regional.status(ck).epochs[shown:]:
                print("  " + describe(record))
                shown += 1
    finally:
        query.stop()

    print("\nregions after the run:\n" + render(regional.status(ck), epochs=False).split("\n", 1)[1])
    try:
        from regional.cli.timeline import draw

        print(f"\ntimeline: {draw(regional.status(ck), work / 'timeline.png')}")
    except regional.RegionalError:
        pass  # matplotlib not installed: the picture is optional
    rows = spark.read.format("delta").load(str(out)).select("region", "offset", "value").collect()
    got = sorted((r.region, r.offset, r.value) for r in rows)
    want = sorted((region, i, v) for region, values in expected.items() for i, v in enumerate(values))
    spark.stop()
    if got != want:
        print(f"\nFAILED: the table holds {len(got)} rows, expected {len(want)}")
        return 1
    print(f"\nOK: the Delta table at {out} holds all {len(want)} input records exactly once, "
          f"including every record of {FAILING!r}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
