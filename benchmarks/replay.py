"""Replaying dead letters: the replay's rows/s next to a plain regional query over the same records, same run.

    python -m benchmarks.replay [--regions 8] [--per-region 25000] [--repeats 2]

One SparkSession (``local[2,4]``), the same records and the same Python UDF in every pipeline, all with
Trigger.AvailableNow into a new Delta table:

- the replay: ``source=deadLetters`` over a dead-letter table holding every record (written as the coordinator
  writes dead letters: the dead-letter target's prepare and commit, one file per region), the UDF fixed;
- regional: ``source=files`` over the same records as text files (one per region), the same UDF;
- stock Spark: the text source over the same files, the same UDF, into Delta.

A dead-letter table holds few records (at most maxDeadLettersPerEpoch per epoch); this measures the replay's
path per record, not a workload. Writes the replay section of BENCHMARKS.md and prints it.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyspark

import regional
from benchmarks.sections import Run, markers, write_section

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = markers("replay")


def values(region: str, n: int) -> list[str]:
    return [f"{region} {i:010d} {'x' * 60}" for i in range(n)]


def write_inputs(work: Path, regions: int, per_region: int) -> tuple[Path, Path]:
    """The same records as text files (one directory per region) and as a dead-letter table."""
    from regional.targets import dead_letter_target

    files, table = work / "files", work / "dead-letters"
    sink = dead_letter_target(str(table), "benchmark")
    handles = {}
    for r in range(regions):
        region = f"r{r:02d}"
        lines = values(region, per_region)
        (files / region).mkdir(parents=True)
        (files / region / "000.txt").write_text("\n".join(lines) + "\n")
        rows = pa.table({"region": [region] * per_region, "offset": pa.array(range(per_region), pa.int64()),
                         "value": lines, "epoch": pa.array([0] * per_region, pa.int64()),
                         "error": ["ValueError: cannot parse"] * per_region})
        handles[region] = sink.prepare(0, region, iter(rows.to_batches()))
    sink.commit(0, handles)
    return files, table


def parse_udf():
    from pyspark.sql import functions as F

    @F.udf("string")
    def parse(value: str) -> str:
        return value.upper()

    return parse


def run(spark, pipeline: str, source: Path, work: Path, rows: int) -> Run:
    from pyspark.sql import functions as F

    parse = parse_udf()
    if pipeline == "stock":
        df = spark.readStream.format("text").load(str(source / "*" / "*.txt"))
        writer = df.select(parse("value").alias("value")).writeStream.format("delta").option("path", str(work / "out"))
    else:
        kind = "deadLetters" if pipeline == "replay" else "files"
        df = spark.readStream.format("regional").option("source", kind).option("path", str(source)).load()
        writer = (df.select("region", "offset", parse(F.col("value")).alias("value")).writeStream.format("regional")
                  .option("target", "delta").option("path", str(work / "out")))
    began = time.perf_counter()
    (writer.option("checkpointLocation", str(work / "ck")).trigger(availableNow=True).start().awaitTermination())
    return Run(pipeline, time.perf_counter() - began, rows)


def render(args: argparse.Namespace, runs: list[Run], elapsed: float) -> str:
    best = {p: max((r for r in runs if r.pipeline == p), key=lambda r: r.rate) for p in ("replay", "files", "stock")}
    rows = args.regions * args.per_region
    return "\n".join([
        BEGIN,
        "## Replaying dead letters: rows/s against a plain regional query over the same records (issue 30)",
        "",
        f"- command: `python -m benchmarks.replay --regions {args.regions} --per-region {args.per_region} "
        f"--repeats {args.repeats}` ({elapsed / 60:.1f} min)",
        f"- machine: 2 cores, Linux {platform.machine()}, Python {platform.python_version()}; pyspark "
        f"{pyspark.__version__}, `local[2,4]`, one session for every pipeline, Trigger.AvailableNow, best of "
        f"{args.repeats}",
        f"- input: {args.regions} regions x {args.per_region:,} records of 82 bytes, the same Python UDF, into a new "
        "Delta table each run",
        "",
        "| pipeline | rows/s | seconds | vs regional (files) | vs stock Spark |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {name} | {best[p].rate:,.0f} | {best[p].seconds:.1f} | {best[p].rate / best['files'].rate:.2f}x | "
          f"{best[p].rate / best['stock'].rate:.2f}x |"
          for p, name in (("replay", "replay (`source=deadLetters` -> Delta)"),
                          ("files", "regional (`source=files` -> Delta)"), ("stock", "stock Spark (text -> Delta)"))),
        "",
        f"- {rows:,} rows per run; every run: " + "; ".join(f"{r.pipeline} {r.rate:,.0f} rows/s ({r.seconds:.1f} s)"
                                                         for r in runs),
        END,
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regions", type=int, default=8)
    parser.add_argument("--per-region", type=int, default=25_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="regional-bench-replay-"))
    rows = args.regions * args.per_region
    try:
        files, table = write_inputs(work, args.regions, args.per_region)
        spark = regional.local_spark("local[2,4]", "regional-bench-replay")
        regional.register(spark)
        spark.sparkContext.setLogLevel("OFF")
        for p in ("stock", "files", "replay"):  # a warm-up of each, not counted: class loading, first workers
            run(spark, p, table if p == "replay" else files, work / f"warm-{p}", rows)
        runs = []
        for i in range(args.repeats):
            for p in ("replay", "files", "stock"):
                runs.append(run(spark, p, table if p == "replay" else files, work / f"{p}-{i}", rows))
                print(f"{p}: {runs[-1].rate:,.0f} rows/s ({runs[-1].seconds:.1f} s)", flush=True)
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    section = render(args, runs, time.perf_counter() - began)
    write_section(Path(args.out), "replay", section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
