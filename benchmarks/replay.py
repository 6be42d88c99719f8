"""Replaying dead letters: the replay's rows/s next to a plain regional query over the same records, same run.

    python -m benchmarks.replay [--regions 8] [--per-region 25000] [--repeats 2] [--topic]

One SparkSession (``local[2,4]``), the same records and the same Python UDF in every pipeline, all with
Trigger.AvailableNow into a new Delta table:

- the replay: ``source=deadLetters`` over a dead-letter table holding every record (written as the coordinator
  writes dead letters: the dead-letter target's prepare and commit, one file per region), the UDF fixed;
- regional: ``source=files`` over the same records as text files (one per region), the same UDF;
- stock Spark: the text source over the same files, the same UDF, into Delta;
- with ``--topic``, the replay of a dead-letter topic too: ``source=deadLetters`` with ``topic``, the same records
  as letters in one Kafka topic (produced as ``deadLetterTopic`` produces them; a real broker on loopback,
  ``regional.testing.kafka_broker``).

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


def write_topic(brokers: str, regions: int, per_region: int) -> str:
    """The same records as letters in a dead-letter topic, as the dead-letter topic's commit produces them."""
    from regional.targets import dead_letter_target

    topic = "bench.dead-letters"
    sink = dead_letter_target(f"kafka:{topic}", "benchmark", {"deadLetter.kafka.bootstrap.servers": brokers,
                                                              "deadLetter.topic.partitions": str(regions)})
    for r in range(regions):  # one transaction per region: a transaction of every letter would be 100s of MB
        region = f"r{r:02d}"
        rows = pa.table({"region": [region] * per_region, "offset": pa.array(range(per_region), pa.int64()),
                         "value": values(region, per_region), "epoch": pa.array([r] * per_region, pa.int64()),
                         "error": ["ValueError: cannot parse"] * per_region})
        sink.commit(r, {region: sink.prepare(r, region, iter(rows.to_batches()))})
    return topic


def parse_udf():
    from pyspark.sql import functions as F

    @F.udf("string")
    def parse(value: str) -> str:
        return value.upper()

    return parse


def run(spark, pipeline: str, source: Path | tuple[str, str], work: Path, rows: int) -> Run:
    from pyspark.sql import functions as F

    parse = parse_udf()
    if pipeline == "stock":
        assert isinstance(source, Path)
        df = spark.readStream.format("text").load(str(source / "*" / "*.txt"))
        writer = df.select(parse("value").alias("value")).writeStream.format("delta").option("path", str(work / "out"))
    else:
        reader = spark.readStream.format("regional")
        if isinstance(source, tuple):  # (brokers, topic): the replay of a dead-letter topic
            reader = (reader.option("source", "deadLetters").option("topic", source[1])
                      .option("kafka.bootstrap.servers", source[0]).option("replayGroup", f"bench-{work.name}"))
        else:
            reader = reader.option("source", "deadLetters" if pipeline == "replay" else "files")
            reader = reader.option("path", str(source))
        df = reader.load()
        writer = (df.select("region", "offset", parse(F.col("value")).alias("value")).writeStream.format("regional")
                  .option("target", "delta").option("path", str(work / "out")))
    began = time.perf_counter()
    (writer.option("checkpointLocation", str(work / "ck")).trigger(availableNow=True).start().awaitTermination())
    return Run(pipeline, time.perf_counter() - began, rows)


PIPELINES = {"replay": "replay of a table (`source=deadLetters`, `path` -> Delta)",
             "replay-topic": "replay of a topic (`source=deadLetters`, `topic` -> Delta)",
             "files": "regional (`source=files` -> Delta)", "stock": "stock Spark (text -> Delta)"}


def render(args: argparse.Namespace, runs: list[Run], elapsed: float) -> str:
    pipelines = [p for p in PIPELINES if any(r.pipeline == p for r in runs)]
    best = {p: max((r for r in runs if r.pipeline == p), key=lambda r: r.rate) for p in pipelines}
    rows = args.regions * args.per_region
    return "\n".join([
        BEGIN,
        "## Replaying dead letters: rows/s against a plain regional query over the same records (issue 30)",
        "",
        f"- command: `python -m benchmarks.replay --regions {args.regions} --per-region {args.per_region} "
        f"--repeats {args.repeats}{' --topic' if args.topic else ''}` ({elapsed / 60:.1f} min)",
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
          for p, name in PIPELINES.items() if p in best),
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
    parser.add_argument("--topic", action="store_true", help="also replay a dead-letter topic (a local broker)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="regional-bench-replay-"))
    rows = args.regions * args.per_region
    broker = None
    try:
        files, table = write_inputs(work, args.regions, args.per_region)
        sources: dict[str, Path | tuple[str, str]] = {"replay": table, "files": files, "stock": files}
        if args.topic:
            from regional.testing.kafka_broker import KafkaBroker

            broker = KafkaBroker(work / "kafka").start()
            sources["replay-topic"] = (broker.bootstrap, write_topic(broker.bootstrap, args.regions, args.per_region))
        spark = regional.local_spark("local[2,4]", "regional-bench-replay")
        regional.register(spark)
        spark.sparkContext.setLogLevel("OFF")
        for p, source in sources.items():  # a warm-up of each, not counted: class loading, first workers
            run(spark, p, source, work / f"warm-{p}", rows)
        runs = []
        for i in range(args.repeats):
            for p, source in sources.items():
                runs.append(run(spark, p, source, work / f"{p}-{i}", rows))
                print(f"{p}: {runs[-1].rate:,.0f} rows/s ({runs[-1].seconds:.1f} s)", flush=True)
        spark.stop()
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    section = render(args, runs, time.perf_counter() - began)
    write_section(Path(args.out), "replay", section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
