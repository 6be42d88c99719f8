"""Poison records: how long until a poisoned region is current again, next to stock Spark, same run.

    python -m benchmarks.dead_letters [--regions 8] [--per-region 20000] [--repeats 1] [--topic]

One SparkSession (``local[2,4]``: task retries on), the same text files (one directory per region,
``<region> <index> <padding>`` per line) and the same Python UDF in every pipeline; the UDF raises on
one poison line, in region r03 at 60% of its records.

- regional (``source=files`` -> ``target=delta``, ``deadLetterPath``), with the poison line: seconds from
  ``start()`` until every healthy region is current, and until the poisoned region is current again (its
  poison record in the dead-letter table, everything else in the target); the epochs that took.
- stock Spark (text source -> UDF -> Delta), without the poison line: seconds to write everything. With it,
  stock Spark cannot finish: the query fails after its task retries (its time to failure is shown).
- regional without the poison line, for what isolation itself costs.
- with ``--topic``: regional with ``deadLetterTopic`` instead of ``deadLetterPath`` (a real broker on loopback,
  ``regional.testing.kafka_broker``), with the poison line: the dead letter produced in one Kafka transaction.

All pipelines run with Trigger.AvailableNow. Writes the dead-letter section of BENCHMARKS.md and prints it.
"""

from __future__ import annotations

import argparse
import math
import platform
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyspark

import regional
from benchmarks.sections import markers, write_section

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = markers("dead-letters")
POISONED = "r03"


def write_input(root: Path, regions: int, per_region: int, poison_at: int | None) -> str:
    """One file per region; returns the poison line (written only when ``poison_at`` is given)."""
    poison = f"{POISONED} {poison_at} POISON"
    for r in range(regions):
        region = f"r{r:02d}"
        (root / region).mkdir(parents=True)
        lines = [f"{region} {i:010d} {'x' * 60}" for i in range(per_region)]
        if region == POISONED and poison_at is not None:
            lines[poison_at] = poison
        (root / region / "000.txt").write_text("\n".join(lines) + "\n")
    return poison


def parse_udf(poison: str):
    from pyspark.sql import functions as F

    @F.udf("string")
    def parse(value: str) -> str:
        if value == poison:
            raise ValueError(f"cannot parse {value!r}")
        return value.upper()

    return parse


def regional_run(spark, inp: Path, work: Path, poison: str, dead_letters: bool, per_region: int,
                 topic_brokers: str | None = None) -> dict[str, float]:
    df = spark.readStream.format("regional").option("source", "files").option("path", str(inp)).load()
    writer = (df.select("region", "offset", parse_udf(poison)("value").alias("value")).writeStream
              .format("regional").option("target", "delta").option("path", str(work / "out"))
              .option("checkpointLocation", str(work / "ck")).trigger(availableNow=True))
    if dead_letters and topic_brokers:
        writer = (writer.option("deadLetterTopic", f"bench.dead-{work.name}")
                  .option("deadLetter.kafka.bootstrap.servers", topic_brokers))
    elif dead_letters:
        writer = writer.option("deadLetterPath", str(work / "dead"))
    began_wall, began = time.time(), time.perf_counter()
    writer.start().awaitTermination()
    total = time.perf_counter() - began
    epochs = regional.status(work / "ck").epochs
    current: dict[str, float] = {}
    for e in epochs:  # the first epoch after which a region has committed (or dead-lettered) all of its input
        for region, state in e.regions.items():
            if region not in current and state.committed_offset >= per_region:
                current[region] = e.recorded_at - began_wall
    healthy = max(t for r, t in current.items() if r != POISONED)
    return {"total": total, "healthy": healthy, "poisoned": current.get(POISONED, math.nan),
            "epochs": len(epochs), "dead": sum(len(e.dead_lettered) for e in epochs)}


def stock_run(spark, inp: Path, work: Path, poison: str) -> tuple[float, str | None]:
    df = spark.readStream.format("text").load(str(inp / "*" / "*.txt"))
    query = (df.select(parse_udf(poison)("value").alias("value")).writeStream.format("delta")
             .option("checkpointLocation", str(work / "ck")).trigger(availableNow=True).start(str(work / "out")))
    began = time.perf_counter()
    try:
        query.awaitTermination()
        error = None
    except Exception as exc:
        error = udf_error(exc)
    return time.perf_counter() - began, error


def udf_error(exc: Exception) -> str:
    """The UDF's own error line: Spark's message names only the stage; the Python cause is in its trace."""
    text = "\n".join([str(exc), str(getattr(exc, "_stackTrace", "") or "")])
    causes = re.findall(r"^(\w+(?:Error|Exception): .+)$", text, re.MULTILINE)
    return (causes[-1] if causes else str(exc).splitlines()[0])[:160]


def render(args: argparse.Namespace, clean: list[float], stock_poisoned: tuple[float, str | None],
           regional_clean: list[dict], regional_poisoned: list[dict], elapsed: float,
           regional_topic: list[dict] | None = None) -> str:
    stock = min(clean)
    best = min(regional_poisoned, key=lambda r: r["poisoned"])
    plain = min(regional_clean, key=lambda r: r["total"])
    n = args.per_region
    bound = math.ceil(math.log2(n)) + 2
    topic = min(regional_topic, key=lambda r: r["poisoned"]) if regional_topic else None
    return "\n".join([
        BEGIN,
        "## Poison records: time until a poisoned region is current again (issue 11)",
        "",
        f"- command: `python -m benchmarks.dead_letters --regions {args.regions} --per-region {n} "
        f"--repeats {args.repeats}{' --topic' if topic else ''}` ({elapsed / 60:.1f} min)",
        f"- machine: 2 cores, Linux {platform.machine()}, Python {platform.python_version()}; pyspark "
        f"{pyspark.__version__}, `local[2,4]`, one session for every pipeline, Trigger.AvailableNow",
        f"- input: {args.regions} regions x {n:,} lines; one Python UDF in every pipeline raises on one line of "
        f"{POISONED} (at offset {int(n * 0.6):,}); regional uses regionAttempts=2 (the default)",
        "",
        "| pipeline | input | seconds to everything written | healthy regions current | poisoned region current |"
        " epochs |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| stock Spark (text -> UDF -> Delta) | clean | {stock:.1f} | {stock:.1f} | - | - |",
        f"| stock Spark | with the poison line | fails after {stock_poisoned[0]:.1f} s | never | never | - |",
        f"| regional (files -> Delta) | clean | {plain['total']:.1f} | {plain['healthy']:.1f} | - | "
        f"{plain['epochs']} |",
        f"| regional + deadLetterPath | with the poison line | {best['total']:.1f} | {best['healthy']:.1f} | "
        f"{best['poisoned']:.1f} | {best['epochs']} |",
        *([f"| regional + deadLetterTopic | with the poison line | {topic['total']:.1f} | {topic['healthy']:.1f} | "
           f"{topic['poisoned']:.1f} | {topic['epochs']} |"] if topic else []),
        "",
        f"- ratio, poisoned region current with regional vs everything written by stock Spark on clean input: "
        f"{best['poisoned'] / stock:.2f}x; healthy regions: {best['healthy'] / stock:.2f}x.",
        *([f"- ratio with deadLetterTopic (the dead letter produced to Kafka in one transaction): poisoned region "
           f"{topic['poisoned'] / stock:.2f}x, healthy regions {topic['healthy'] / stock:.2f}x; "
           f"{topic['dead']} record dead-lettered."] if topic else []),
        f"- isolation: {best['epochs']} epochs in all, {best['dead']} record dead-lettered; the bound for one poison "
        f"record among {n:,} is ceil(log2 n) + 2 = {bound} epochs of its region, besides the first.",
        f"- stock Spark's error: `{stock_poisoned[1]}`" if stock_poisoned[1] else "- stock Spark did not fail (?)",
        "- every run: stock clean " + ", ".join(f"{s:.1f} s" for s in clean) + "; regional clean "
        + ", ".join(f"{r['total']:.1f} s" for r in regional_clean) + "; regional poisoned "
        + ", ".join(f"{r['total']:.1f} s (poisoned region current at {r['poisoned']:.1f} s)"
                    for r in regional_poisoned),
        END,
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dead_letters", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regions", type=int, default=8)
    parser.add_argument("--per-region", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--topic", action="store_true", help="also dead letters to a Kafka topic (a local broker)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="regional-bench-dead-letters-"))
    broker = None
    try:
        if args.topic:
            from regional.testing.kafka_broker import KafkaBroker

            broker = KafkaBroker(work / "kafka").start()
        poison = write_input(work / "poisoned", args.regions, args.per_region, int(args.per_region * 0.6))
        write_input(work / "clean", args.regions, args.per_region, None)
        spark = regional.local_spark("local[2,4]", "regional-bench-dead-letters")
        regional.register(spark)
        spark.sparkContext.setLogLevel("OFF")
        # A warm-up of each pipeline, not counted: the first query of a session pays the JVM's class loading.
        stock_run(spark, work / "clean", work / "stock-warm", poison)
        regional_run(spark, work / "clean", work / "rc-warm", poison, False, args.per_region)
        clean, regional_clean, regional_poisoned, regional_topic = [], [], [], []
        for i in range(args.repeats):
            clean.append(stock_run(spark, work / "clean", work / f"stock-{i}", poison)[0])
            regional_clean.append(regional_run(spark, work / "clean", work / f"rc-{i}", poison, False, args.per_region))
            regional_poisoned.append(regional_run(spark, work / "poisoned", work / f"rp-{i}", poison, True,
                                                  args.per_region))
            if broker is not None:
                regional_topic.append(regional_run(spark, work / "poisoned", work / f"rt-{i}", poison, True,
                                                   args.per_region, broker.bootstrap))
            print(f"stock {clean[-1]:.1f} s; regional clean {regional_clean[-1]}; poisoned {regional_poisoned[-1]}"
                  + (f"; to a topic {regional_topic[-1]}" if regional_topic else ""), flush=True)
        stock_poisoned = stock_run(spark, work / "poisoned", work / "stock-poisoned", poison)
        spark.stop()
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    write_section(Path(args.out), "dead-letters",
                  render(args, clean, stock_poisoned, regional_clean, regional_poisoned, time.perf_counter() - began,
                         regional_topic))
    return 0


if __name__ == "__main__":
    sys.exit(main())
