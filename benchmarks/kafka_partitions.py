"""Kafka at many partitions: one topic of 1,000 partitions, regional next to stock Spark, same run (issue 31).

    python -m benchmarks.kafka_partitions [--partitions 1000] [--active 10] [--bursts 12] [--records 2000000]
                                          [--repeats 3] [--out BENCHMARKS.md]

Three measures, one broker (KRaft, loopback), one ``local[2,4]`` session:

- **Few partitions active.** A query reads a topic of ``--partitions`` partitions with the default trigger;
  a burst of 100 records goes to each of ``--active`` partitions picked at random, the next burst once the
  last is in the Delta table. The same on a topic of 16 partitions. An epoch's latency is its
  ``triggerExecution`` time in Spark's progress, over the epochs that carried records; the first three bursts
  warm up. Regional and stock Spark's Kafka source into delta-spark, on both topics. The regional query runs
  a second time in a process of its own with its consumer pool off (``REGIONAL_KAFKA_POOL=off``: a new
  librdkafka consumer per task, as before the pool) to show what the pool saves.
- **The floor.** The same with one record into one of 16 partitions: an epoch with almost nothing to do.
- **Every partition active.** ``--records`` records of 200 bytes spread over all the partitions, read from
  earliest with Trigger.AvailableNow into a new Delta table; rows/s from ``start()`` to the end. Alternating,
  after a warm-up pair; min/median/max over ``--repeats``; peak memory.

Writes the kafka-partitions section of BENCHMARKS.md and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import regional
from benchmarks.common import KAFKA_PACKAGE, Footprint, delta_rows, spread, wait_until
from benchmarks.kafka import produce as produce_spread
from benchmarks.latency import start
from benchmarks.sections import markers, write_section
from regional.testing.kafka_broker import KafkaBroker

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = markers("kafka-partitions")
PIPELINES = ("stock", "regional")
WARM_BURSTS = 3
BURST_RECORDS = 100  # per active partition


def session():
    return regional.local_spark("local[2,4]", "regional-bench-kafka-partitions", {
        "spark.jars.packages": KAFKA_PACKAGE, "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "4g"})


def bursts(spark, pipeline: str, broker: KafkaBroker, partitions: int, args: argparse.Namespace,
           work: Path, active: int | None = None, records: int = BURST_RECORDS) -> list[float]:
    """The triggerExecution seconds of each counted epoch that carried records: bursts of ``records`` records
    into each of ``active`` (default ``--active``) random partitions."""
    active = args.active if active is None else active
    topic = f"bursts-{pipeline}-{partitions}-{active}x{records}-{os.getpid()}"
    broker.create_topic(topic, partitions)
    out, ck = work / f"{topic}-out", work / f"{topic}-ck"
    query = start(spark, pipeline, broker, topic, out, ck, available_now=False)
    producer = broker.producer(**{"linger.ms": "1"})
    rng = random.Random(partitions)
    sent, counted_from = 0, 0
    try:
        wait_until(lambda: query.lastProgress is not None, 120)
        for burst in range(WARM_BURSTS + args.bursts):
            if burst == WARM_BURSTS:
                counted_from = len(query.recentProgress)
            for p in rng.sample(range(partitions), active):
                for i in range(records):
                    producer.produce(topic, value=f"{burst} {p} {i}".encode(), partition=p)
            assert producer.flush(30) == 0
            sent += active * records

            def landed(want: int = sent) -> bool:
                if query.exception() is not None:
                    raise RuntimeError(f"{pipeline} failed: {query.exception()}")
                return delta_rows(out) >= want

            wait_until(landed, 120)
            time.sleep(0.3)  # the progress event of the epoch that landed it
        progress = query.recentProgress[counted_from:]
    finally:
        query.stop()
    seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in progress if p["numInputRows"] > 0]
    print(f"{pipeline}, {partitions} partitions, {active} active x {records} records: epochs "
          f"{statistics.median(seconds):.2f} s (median of {len(seconds)})", flush=True)
    return seconds


def few_active(spark, broker: KafkaBroker, args: argparse.Namespace, work: Path,
               pipelines: tuple[str, ...]) -> dict[str, dict[int, list[float]]]:
    """Epoch latencies by partition count; under key 0, the floor: one record into one of 16 partitions."""
    return {pipeline: {n: bursts(spark, pipeline, broker, n, args, work) for n in (16, args.partitions)}
            | {0: bursts(spark, pipeline, broker, 16, args, work, active=1, records=1)}
            for pipeline in pipelines}


def all_active(spark, broker: KafkaBroker, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    topic = f"all-{os.getpid()}"
    broker.create_topic(topic, args.partitions)
    produce_spread(broker, topic, args.partitions, args.records, 200)
    rates: dict[str, list[float]] = {p: [] for p in PIPELINES}
    footprints = {}
    for number in range(args.repeats + 1):
        for pipeline in PIPELINES:
            out, ck = work / f"all-{pipeline}-{number}-out", work / f"all-{pipeline}-{number}-ck"
            footprint = Footprint()
            began = time.perf_counter()
            query = start(spark, pipeline, broker, topic, out, ck, available_now=True)
            query.awaitTermination()
            seconds = time.perf_counter() - began
            footprints[pipeline] = footprint.stop().describe()
            rows = delta_rows(out)
            assert rows == args.records, f"{pipeline} wrote {rows} of {args.records} records"
            print(f"{pipeline} all {args.partitions} active, run {number}: {rows / seconds:,.0f} rows/s "
                  f"({seconds:.1f} s)", flush=True)
            if number:  # the first pair warms up
                rates[pipeline].append(rows / seconds)
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(ck, ignore_errors=True)
    return {"rates": rates, "memory": footprints}


def unpooled(args: argparse.Namespace) -> dict[int, list[float]]:
    """The regional few-active scenario in a process of its own with the consumer pool off."""
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        subprocess.run([sys.executable, "-m", "benchmarks.kafka_partitions", "--unpooled-json", result.name,
                        "--partitions", str(args.partitions), "--active", str(args.active),
                        "--bursts", str(args.bursts)], cwd=ROOT, check=True,
                       env={**os.environ, "REGIONAL_KAFKA_POOL": "off"})
        return {int(k): v for k, v in json.loads(Path(result.name).read_text()).items()}


WHERE = ("- where the all-active time went (2026-11-26): each task waited about 40 ms on Spark's loopback TCP to "
         "its Python workers (Nagle's algorithm holding the input behind the command until the worker's delayed "
         "ACK), and each worker spent 23-60 ms in pyspark's gc.collect() after every task. regional's sessions "
         "now use Unix domain sockets and its workers freeze what their imports made: 500,000 records over the "
         "1,000 partitions went from 8,622 to 36,964 rows/s (stock 21,904, a probe in one session); this table "
         "was 0.38x before.")


def render(args: argparse.Namespace, few: dict[str, dict[int, list[float]]], off: dict[int, list[float]],
           every: dict[str, Any], elapsed: float) -> str:
    n = args.partitions

    def med(values: list[float]) -> float:
        return statistics.median(values)

    growth = {p: med(few[p][n]) / med(few[p][16]) for p in PIPELINES}
    rates = every["rates"]
    ratio = med(rates["regional"]) / med(rates["stock"])
    rows = [
        f"| epoch latency, {args.active} of 16 partitions active (s, min/median/max) | "
        f"{spread(few['stock'][16], '{:.2f}')} | {spread(few['regional'][16], '{:.2f}')} | | |",
        f"| epoch latency, {args.active} of {n:,} partitions active (s, min/median/max) | "
        f"{spread(few['stock'][n], '{:.2f}')} | {spread(few['regional'][n], '{:.2f}')} | | |",
        f"| the floor: epoch latency with 1 record in 1 of 16 partitions (s, min/median/max) | "
        f"{spread(few['stock'][0], '{:.2f}')} | {spread(few['regional'][0], '{:.2f}')} | | |",
        f"| {n:,} partitions vs 16, median epoch latency | {growth['stock']:.2f}x | {growth['regional']:.2f}x | "
        f"<= 1.5x | {'yes' if growth['regional'] <= 1.5 else 'no'} |",
        f"| all {n:,} partitions active, rows/s (min/median/max) | {spread(rates['stock'])} | "
        f"{spread(rates['regional'])} | >= 1.0x stock ({ratio:.2f}x) | {'yes' if ratio >= 1.0 else 'no'} |",
    ]
    pool = (f"- the consumer pool: with it off (a new librdkafka consumer per task, as before), regional's median "
            f"epoch latency was {med(off[16]):.2f} s at 16 partitions and {med(off[n]):.2f} s at {n:,} "
            f"(with it: {med(few['regional'][16]):.2f} s and {med(few['regional'][n]):.2f} s), in a process of its "
            "own in the same run.")
    return "\n".join([
        BEGIN,
        f"## Kafka at {n:,} partitions (issue 31)",
        "",
        f"Command: `python -m benchmarks.kafka_partitions --partitions {n} --active {args.active} --bursts "
        f"{args.bursts} --records {args.records} --repeats {args.repeats}` ({elapsed / 60:.0f} min). One broker "
        f"(KRaft, loopback), `local[2,4]`; stock is Spark's Kafka source ({KAFKA_PACKAGE}) into delta-spark, "
        "regional its Kafka source into its Delta target. Epoch latency: Spark's `triggerExecution` of each "
        f"epoch that carried a burst ({BURST_RECORDS} records into each of {args.active} random partitions, the next "
        f"once the last is in the table; {args.bursts} bursts after {WARM_BURSTS} warm-up ones), default trigger. "
        f"All active: {args.records:,} records of 200 bytes over the {n:,} partitions, AvailableNow from earliest, "
        "alternating after a warm-up pair.",
        "",
        "| metric | stock | regional | goal | met |",
        "|---|---|---|---|---|",
        *rows,
        "",
        pool,
        WHERE,
        f"- peak memory, all active: stock: {every['memory']['stock']}; regional: {every['memory']['regional']}.",
        END,
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kafka_partitions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--active", type=int, default=10)
    parser.add_argument("--bursts", type=int, default=12)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--unpooled-json", help=argparse.SUPPRESS)  # the child run of ``unpooled``
    args = parser.parse_args(argv)
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="regional-bench-kafka-partitions-"))
    broker = KafkaBroker(work / "broker").start()
    try:
        spark = session()
        regional.register(spark)
        spark.sparkContext.setLogLevel("OFF")
        if args.unpooled_json:
            few = few_active(spark, broker, args, work, ("regional",))
            Path(args.unpooled_json).write_text(json.dumps(few["regional"]))
            spark.stop()
            return 0
        few = few_active(spark, broker, args, work, PIPELINES)
        every = all_active(spark, broker, args, work)
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    off = unpooled(args)
    section = render(args, few, off, every, time.perf_counter() - began)
    write_section(Path(args.out), "kafka-partitions", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
