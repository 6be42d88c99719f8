"""Files into PostgreSQL: regional's target=postgres vs Spark's JDBC path, same rows, same server, same run.

    python -m benchmarks.postgres [--rows 4000000] [--regions 16] [--size 100] [--repeats 3]

One real PostgreSQL server (Debian's package, loopback, ``fsync=off`` for both), one SparkSession
(``local[2,4]``) holding both pipelines, both with Trigger.AvailableNow over the same text files, one
directory per region, every line starting with its region id.

- regional: ``source=files`` -> ``target=postgres`` (COPY and PREPARE TRANSACTION per region,
  COMMIT PREPARED on the driver), writing ``region, offset, value``.
- stock: Spark's text source -> ``foreachBatch`` with ``df.write.jdbc`` (the PostgreSQL JDBC driver from
  Maven Central, ``reWriteBatchedInserts=true``, batchsize 10000), writing ``region, value``. Not
  exactly once: a failure between batches writes rows twice; it is here for speed only.

rows/s is rows / wall time from ``start()`` to the end. Runs alternate; the first pair warms up and is not
counted; min/median/max over ``--repeats``. Each run also reports where its CPU went (the JVM, the Python
workers, the PostgreSQL server, from /proc), how long the query took to start its first batch, and the
rows/s of that batch alone (Spark's ``triggerExecution``); peak memory is sampled over every counted run.
Writes the PostgreSQL section of BENCHMARKS.md (between its markers) and prints it.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pyspark

import regional
from benchmarks.common import Footprint, cpu_by_process, cpu_per_million, spread
from benchmarks.sections import markers, write_section
from regional.testing.postgres_server import PostgresServer

ROOT = Path(__file__).resolve().parent.parent
JDBC_PACKAGE = "org.postgresql:postgresql:42.7.8"
BEGIN, END = markers("postgres")
ROWS_PER_FILE = 50_000
PIPELINES = ("stock", "regional")


@dataclass
class Measured:
    """One timed run: wall time, the first batch's start and length, CPU seconds by process group."""

    pipeline: str
    rows: int
    seconds: float
    to_first_batch: float  # start() until Spark began the first batch
    in_batches: float  # Spark's triggerExecution, summed over the batches with rows
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def write_input(root: Path, regions: int, rows: int, size: int) -> None:
    per_region = rows // regions
    for r in range(regions):
        region = f"r{r:02d}"
        directory = root / region
        directory.mkdir(parents=True)
        pad = "x" * max(size - 16, 0)
        for start in range(0, per_region, ROWS_PER_FILE):
            lines = (f"{region} {i:010d} {pad}\n" for i in range(start, min(start + ROWS_PER_FILE, per_region)))
            (directory / f"{start:012d}.txt").write_text("".join(lines))


def count(server: PostgresServer, table: str) -> int:
    with server.connect() as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def timed(pipeline: str, start, server: PostgresServer, table: str) -> Measured:
    before = cpu_by_process(server.postmaster_pid)
    began, wall = time.perf_counter(), time.time()
    handle = start()
    handle.awaitTermination()
    seconds = time.perf_counter() - began
    after = cpu_by_process(server.postmaster_pid)
    batches = [p for p in handle.recentProgress if p["numInputRows"] > 0]
    first = datetime.fromisoformat(batches[0]["timestamp"].replace("Z", "+00:00")).timestamp() - wall
    return Measured(pipeline, count(server, table), seconds, first,
                    sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000,
                    {k: after[k] - before.get(k, 0.0) for k in after})


def regional_run(spark, server: PostgresServer, inp: Path, work: Path, table: str) -> Measured:
    from pyspark.sql import functions as F

    df = spark.readStream.format("regional").option("source", "files").option("path", str(inp)).load()
    query = (df.select("region", "offset", F.upper("value").alias("value")).writeStream.format("regional")
             .option("target", "postgres").option("url", server.url).option("table", table)
             .option("keepRegionColumns", "true").option("checkpointLocation", str(work / "ck"))
             .trigger(availableNow=True))
    return timed("regional", query.start, server, table)


def stock_run(spark, server: PostgresServer, inp: Path, work: Path, table: str) -> Measured:
    from pyspark.sql import functions as F

    url = f"jdbc:postgresql://127.0.0.1:{server.port}/postgres?reWriteBatchedInserts=true"
    properties = {"user": "postgres", "driver": "org.postgresql.Driver", "batchsize": "10000"}
    df = (spark.readStream.format("text").load(str(inp / "*" / "*.txt"))
          .select(F.substring_index("value", " ", 1).alias("region"), F.upper("value").alias("value")))

    def write(batch, _batch_id: int) -> None:
        batch.write.jdbc(url, table, mode="append", properties=properties)

    query = (df.writeStream.option("checkpointLocation", str(work / "ck")).foreachBatch(write)
             .trigger(availableNow=True))
    return timed("stock", query.start, server, table)


def render(args: argparse.Namespace, runs: list[Measured], memory: dict[str, str], elapsed: float) -> str:
    by = {name: [r for r in runs if r.pipeline == name] for name in PIPELINES}

    def med(name: str, value) -> float:
        return statistics.median(value(r) for r in by[name])

    ratio = med("regional", lambda r: r.rate) / med("stock", lambda r: r.rate)
    in_batches = {name: med(name, lambda r: r.rows / r.in_batches) for name in PIPELINES}

    def cpu(name: str) -> str:  # every run wrote the same rows (main checks)
        return cpu_per_million([r.cpu for r in by[name]], by[name][0].rows)

    return "\n".join([
        BEGIN,
        "## PostgreSQL target (issues 12, 31)",
        "",
        f"- command: `python -m benchmarks.postgres --rows {args.rows} --regions {args.regions} --size {args.size} "
        f"--repeats {args.repeats}` ({elapsed / 60:.1f} min)",
        f"- machine: 2 cores, Linux {platform.machine()}, Python {platform.python_version()}; PostgreSQL from "
        "Debian's package on the same machine (loopback, fsync=off for both pipelines)",
        f"- versions: pyspark {pyspark.__version__}, stock JDBC driver {JDBC_PACKAGE} "
        "(reWriteBatchedInserts=true, batchsize 10000), regional with psycopg 3 (COPY)",
        f"- input: {args.rows:,} lines of {args.size} bytes in {args.regions} region directories; Spark "
        "`local[2,4]`, both pipelines in one session, AvailableNow, runs alternating after a warm-up pair",
        "",
        "| scenario | metric | stock (foreachBatch, df.write.jdbc) | regional (postgres) | ratio (medians) | goal "
        "| met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| P1. files -> PostgreSQL, {args.regions} regions | rows/s, min/median/max | "
        f"{spread([r.rate for r in by['stock']])} | {spread([r.rate for r in by['regional']])} | {ratio:.2f}x | "
        f">= 1x stock | {'yes' if ratio >= 1 else 'no'} |",
        f"| the same, inside Spark's batches only | rows/s (rows / triggerExecution), median | "
        f"{in_batches['stock']:,.0f} | {in_batches['regional']:,.0f} | "
        f"{in_batches['regional'] / in_batches['stock']:.2f}x | | |",
        f"| start-up | s from start() to the first batch, median | {med('stock', lambda r: r.to_first_batch):.2f} | "
        f"{med('regional', lambda r: r.to_first_batch):.2f} | | | |",
        "",
        f"- CPU seconds per million rows, median: stock: {cpu('stock')}; regional: {cpu('regional')}.",
        f"- peak memory: stock: {memory['stock']}; regional: {memory['regional']}.",
        "- every run: " + "; ".join(f"{r.pipeline} {r.rate:,.0f} rows/s ({r.seconds:.1f} s)" for r in runs),
        "- regional is exactly once (prepared transactions per region); the JDBC path is not.",
        f"- where regional's time goes ({WHERE_MEASURED}): {WHERE}",
        END,
    ])


WHERE_MEASURED = ("measured 2026-11-25 (timers in target=postgres's prepare, 1,000,000 rows, not committed) "
                  "and 2026-11-26")
WHERE = (
    "the PostgreSQL target is not the gap: over the 16 tasks of a run its sink spent 1.8 s waiting for the next "
    "batch from Spark, 0.36 s in COPY writes, 0.06 s encoding CSV and 0.04 s in PREPARE. Binary COPY or a second "
    "thread would shave the 0.4 s the target has, not the rest; larger Arrow batches (50,000 rows on both sides) "
    "changed nothing. On 2026-11-26 the Python workers began to freeze what their imports made (pyspark's "
    "gc.collect() after each task had walked ~55,000 objects) and to talk to Spark over Unix domain sockets (the "
    "ratio inside the batches went from 0.82x to 0.97x); then source=files began to split a file into lines in "
    "Arrow (a task had spent more time decoding the file into a Python string and copying it into Arrow) and the "
    "driver to read a listing's new files on several threads: inside the batches regional is now ahead. What is "
    "left is the start-up before the first batch (the row above), most of it pyspark's streaming source runner, a "
    "new Python process per query that imports pyspark from `pyspark.zip` (0.6-0.7 s by timestamps in the runner; "
    "py-spy: 0.5 s compiling modules zipimport cannot cache, 0.2 s re-reading the zip's index in "
    "`invalidate_caches`, which pyspark's `setup_spark_files` calls); Spark starts that process and puts that zip "
    "first on its path, so regional cannot shorten it. A longer run pays it once: the ratio over the whole run "
    "moves toward the one inside the batches.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.postgres", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--regions", type=int, default=16)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="regional-bench-postgres-"))
    server = PostgresServer().start()
    runs: list[Measured] = []
    memory: dict[str, str] = {}
    try:
        write_input(work / "in", args.regions, args.rows, args.size)
        spark = regional.local_spark("local[2,4]", "regional-bench-postgres", {"spark.jars.packages": JDBC_PACKAGE})
        regional.register(spark)
        spark.sparkContext.setLogLevel("OFF")
        footprints: dict[str, list[Footprint]] = {name: [] for name in PIPELINES}
        for i in range(args.repeats + 1):
            for name, fn in (("stock", stock_run), ("regional", regional_run)):
                footprint = Footprint()
                run = fn(spark, server, work / "in", work / f"{name}-{i}", f"bench_{name}_{i}")
                footprints[name].append(footprint.stop())
                assert run.rows == args.rows // args.regions * args.regions, f"{name} wrote {run.rows} rows"
                cpu = ", ".join(f"{k} {v:.1f}" for k, v in run.cpu.items())
                print(f"{name}{' (warm-up)' if not i else ''}: {run.rate:,.0f} rows/s ({run.seconds:.1f} s, first "
                      f"batch after {run.to_first_batch:.2f} s), CPU s: {cpu}", flush=True)
                if i:  # the first pair warms up
                    runs.append(run)
        memory = {name: max(fs[1:] or fs, key=lambda f: f.driver_mb).describe() for name, fs in footprints.items()}
        spark.stop()
    finally:
        server.remove()
        shutil.rmtree(work, ignore_errors=True)
    write_section(Path(args.out), "postgres", render(args, runs, memory, time.perf_counter() - began))
    return 0


if __name__ == "__main__":
    sys.exit(main())
