"""Latency at an ordinary rate: Kafka into Delta, regional next to stock Spark, in the same run (issue 31).

    python -m benchmarks.latency [--rate 1000] [--partitions 16] [--seconds 40] [--repeats 3] [--out BENCHMARKS.md]

A producer writes ``--rate`` records/s round-robin over ``--partitions`` partitions for ``--seconds``, each value
holding its produce time. Each pipeline runs with its lowest practical trigger (the default: the next batch
as soon as the last ends) from a new topic into a new Delta table: stock Spark's Kafka source into delta-spark,
regional's Kafka source into its Delta target. A record's latency is the timestamp of the Delta commit that
added it (``commitInfo.timestamp``, read from ``_delta_log``: delta-spark and delta-rs both write it) minus its
produce time: the moment a reader of the table can see it. Same machine, same clock.

Runs alternate stock/regional; the first pair warms up and is not counted. Reported: p50 and p99 of each run
(min/median/max over the counted runs), and each pipeline's median time between commits while it is loaded.
Writes the latency section of BENCHMARKS.md and prints it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import regional
from benchmarks.common import KAFKA_PACKAGE, delta_rows
from benchmarks.sections import markers, write_section
from regional.testing.kafka_broker import KafkaBroker

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = markers("latency")
PIPELINES = ("stock", "regional")


def produce(broker: KafkaBroker, topic: str, partitions: int, rate: int, seconds: float) -> int:
    """``rate`` records/s for ``seconds``, in ticks of 10 ms; each value is ``<seq> <produce time>``."""
    producer = broker.producer(**{"linger.ms": "1"})
    seq, began = 0, time.time()
    while (now := time.time()) < began + seconds:
        due = int((now - began) * rate)
        while seq < due:
            producer.produce(topic, value=f"{seq} {time.time():.6f}".encode(), partition=seq % partitions)
            seq += 1
        producer.poll(0)
        time.sleep(0.01)
    assert producer.flush(60) == 0
    return seq


def start(spark, pipeline: str, broker: KafkaBroker, topic: str, out: Path, ck: Path, available_now: bool = False):
    """Kafka into Delta from earliest: stock Spark's Kafka source into delta-spark, or regional's source into its
    Delta target; the default trigger, or AvailableNow."""
    if pipeline == "stock":
        df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest").load())
        writer = (df.selectExpr("CAST(value AS STRING) AS value").writeStream.format("delta")
                  .option("checkpointLocation", str(ck)).option("path", str(out)))
    else:
        df = (spark.readStream.format("regional").option("source", "kafka")
              .option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", topic)
              .option("startingOffsets", "earliest").load())
        writer = (df.selectExpr("region", "offset", "CAST(value AS STRING) AS value").writeStream
                  .format("regional").option("target", "delta").option("path", str(out))
                  .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true"))
    return (writer.trigger(availableNow=True) if available_now else writer).start()


def commits(table: Path) -> list[tuple[float, list[str]]]:
    """Each commit of the table: its timestamp (s) and the data files it added."""
    found = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        stamp, added = None, []
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                stamp = action["commitInfo"].get("timestamp")
            if "add" in action:
                added.append(action["add"]["path"])
        if stamp is not None and added:
            found.append((stamp / 1000.0, added))
    return found


def latencies(table: Path) -> tuple[list[float], list[float]]:
    """Every record's latency (s), and the intervals between consecutive commits (s)."""
    import pyarrow.parquet as pq

    values = []
    history = commits(table)
    for (stamp, added) in history:
        for path in added:
            for value in pq.read_table(table / path, columns=["value"]).column("value").to_pylist():
                values.append(stamp - float(value.split(" ", 1)[1]))
    stamps = [stamp for stamp, _added in history]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return values, gaps


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_run(spark, pipeline: str, broker: KafkaBroker, work: Path, args: argparse.Namespace,
            number: int) -> dict[str, float]:
    topic = f"latency-{pipeline}-{number}"
    broker.create_topic(topic, args.partitions)
    out, ck = work / f"{topic}-out", work / f"{topic}-ck"
    query = start(spark, pipeline, broker, topic, out, ck)
    try:
        deadline = time.monotonic() + 120  # the query's first (empty) batches: start-up, not latency
        while query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)
        sent = produce(broker, topic, args.partitions, args.rate, args.seconds)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if delta_rows(out) >= sent:
                break
            if query.exception() is not None:
                raise RuntimeError(f"{pipeline} failed: {query.exception()}")
            time.sleep(1.0)
    finally:
        query.stop()
    values, gaps = latencies(out)
    assert len(values) == sent, f"{pipeline} landed {len(values)} of {sent} records"
    result = {"p50": quantile(values, 0.5), "p99": quantile(values, 0.99), "gap": statistics.median(gaps),
              "records": float(sent)}
    print(f"{pipeline} run {number}: p50 {result['p50']:.2f} s, p99 {result['p99']:.2f} s, "
          f"{len(gaps) + 1} commits, median {result['gap']:.2f} s apart, {sent:,} records", flush=True)
    return result


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f}"


def render(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]], elapsed: float) -> str:
    med = {p: {k: statistics.median(r[k] for r in runs[p]) for k in ("p50", "p99", "gap")} for p in PIPELINES}
    rows = []
    for key, label in (("p50", "p50 latency (s)"), ("p99", "p99 latency (s)")):
        ratio = med["regional"][key] / med["stock"][key]
        rows.append(f"| {label}, min/median/max | {spread([r[key] for r in runs['stock']])} | "
                    f"{spread([r[key] for r in runs['regional']])} | {ratio:.2f}x | <= 1.0x stock | "
                    f"{'yes' if ratio <= 1.0 else 'no'} |")
    rows.append(f"| time between commits (s), median | {med['stock']['gap']:.2f} | {med['regional']['gap']:.2f} | "
                f"{med['regional']['gap'] / med['stock']['gap']:.2f}x | | |")
    return "\n".join([
        BEGIN,
        "## Latency at an ordinary rate: Kafka into Delta (issue 31)",
        "",
        f"Command: `python -m benchmarks.latency --rate {args.rate} --partitions {args.partitions} --seconds "
        f"{args.seconds:g} --repeats {args.repeats}` ({elapsed / 60:.0f} min). {args.rate:,} records/s over "
        f"{args.partitions} partitions for {args.seconds:g} s per run, a new topic and table each run; stock is "
        f"Spark's Kafka source ({KAFKA_PACKAGE}) into delta-spark, regional its Kafka source into its Delta target, "
        "each with the default trigger (the next batch as soon as the last ends), alternating in one "
        "`local[2,4]` session (2 shuffle partitions) after a warm-up pair. Latency: the Delta commit's "
        "timestamp minus the record's produce time (when a reader can see it), over every record.",
        "",
        "| metric | stock | regional | regional/stock | goal | met |",
        "|---|---|---|---|---|---|",
        *rows,
        END,
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.latency", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="regional-bench-latency-"))
    broker = KafkaBroker(work / "broker").start()
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in PIPELINES}
    try:
        # Two shuffle partitions, as benchmarks.run sets: delta-spark reconstructs its snapshot with a shuffle at
        # commits, and 200 partitions on two cores would slow stock Spark for no reason of its own.
        spark = regional.local_spark("local[2,4]", "regional-bench-latency", {
            "spark.jars.packages": KAFKA_PACKAGE, "spark.sql.shuffle.partitions": "2"})
        regional.register(spark)
        spark.sparkContext.setLogLevel("OFF")
        for number in range(args.repeats + 1):
            for pipeline in PIPELINES:
                result = one_run(spark, pipeline, broker, work, args, number)
                if number:  # the first pair warms up
                    runs[pipeline].append(result)
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    write_section(Path(args.out), "latency", render(args, runs, time.perf_counter() - began))
    return 0


if __name__ == "__main__":
    sys.exit(main())
