"""Kafka into Kafka: regional's Kafka target vs Spark's own Kafka sink (spark-sql-kafka-0-10), same run (issue 56).

    python -m benchmarks.kafka_target [--records 2000000] [--partitions 16] [--size 200]
                                      [--max-offsets 500000] [--repeats 1] [--latency-seconds 60]

One real broker (KRaft, loopback), one SparkSession (``local[2,4]``) holding every pipeline.

- Throughput: an input topic of ``--records`` records of ``--size`` bytes over ``--partitions`` partitions; each
  pipeline copies it whole, with Trigger.AvailableNow and the same ``maxOffsetsPerTrigger``, into a new output
  topic of as many partitions. Stock: Spark's Kafka source into Spark's Kafka sink (at least once). Regional: its
  Kafka source, ``select("region", "offset", "key", "value")``, into ``target=kafka`` (one transaction per epoch,
  produced by the driver). rows/s is records / wall time from ``start()`` to the end. A warm-up pair on a small
  topic runs first (the JVM's and the Python workers' first use). Each output is then read back: stock's must hold
  every input record (at least once: its duplicates are counted), regional's, read ``read_committed``, each input
  record exactly once.
- Where regional's time goes: phase two of each epoch (the driver producing every staged record in the epoch's
  transaction) is the time from its intent (``regional/intents/<epoch>.json``, written at the decision) to its
  record (``regional/epochs/<epoch>.json``, written once the transaction committed), from the files' mtimes.
- The driver's memory: phase two runs in Spark's sink-runner Python worker on the driver (pyspark's
  ``python_streaming_sink_runner``, a child of the JVM), not in this process. Every Python process below the JVM and
  this process are sampled from /proc every 0.1 s during the regional run: the sink runner's peak RSS and its growth
  over the first sample, against the rows per epoch.
- The other end of the design: ONE transactional producer in this process (regional's own ``EpochTransaction``,
  the driver's code, no Spark) produces the same records into a new topic in transactions of
  ``maxOffsetsPerTrigger`` records, twice: from a list of bytes (librdkafka's rate through Python), and through
  an Arrow IPC stream read back and turned into Python values (what ``_produce_region`` does).
- Latency at 1,000 records/s (``--latency-seconds``, 0 to skip): a producer writes 1,000 records/s round-robin over
  the partitions, each value holding its send time; each pipeline (default trigger) copies them into a new topic;
  a consumer (``read_committed`` for regional) takes arrival time - send time of every record. Stock, then regional.

Writes the kafka-target section of BENCHMARKS.md (between its markers) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark

import regional
from benchmarks.common import KAFKA_PACKAGE, Periodic
from benchmarks.kafka import phases, produce
from benchmarks.sections import Run, markers, write_section
from regional.targets.kafka.records import STAGED
from regional.targets.kafka.target import JAVA_PARTITIONER
from regional.targets.kafka.transaction import EpochTransaction, send
from regional.testing.kafka_broker import KafkaBroker
from regional.testing.processes import descendants, process_table, rss_mb

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = markers("kafka-target")
SINK_RUNNER = "sink_runner"  # in the command line of pyspark's python_streaming_sink_runner worker


# -- reading an output topic back --------------------------------------------------------------------------------


def count_output(broker: KafkaBroker, topic: str, records: int, isolation: str) -> tuple[int, int, int]:
    """(records read, distinct input records among them, duplicates) of ``topic`` read to its end with
    ``isolation``; each value starts with its input sequence number (``%012d-``)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    seen = bytearray(records)
    total = dupes = 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"count-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "isolation.level": isolation, "enable.partition.eof": True})
    try:
        parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        todo = []
        for p in parts:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                todo.append(TopicPartition(topic, p, low))
        consumer.assign(todo)
        left, deadline = len(todo), time.monotonic() + 300
        while left and time.monotonic() < deadline:
            for m in consumer.consume(10000, timeout=0.5):
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        left -= 1
                    continue
                total += 1
                seq = int((m.value() or b"")[:12])
                if seen[seq]:
                    dupes += 1
                seen[seq] = 1
        assert not left, f"could not read {topic} to its end"
    finally:
        consumer.close()
    return total, sum(seen), dupes


# -- sampling ------------------------------------------------------------------------------------------------------


class Memory(Periodic):
    """RSS of this process and of every Python process below this driver's JVM, every ``interval`` seconds."""

    def __init__(self, interval: float = 0.1) -> None:
        super().__init__(interval)
        self.me = os.getpid()
        self.own_first = rss_mb(self.me)
        self.own_peak = self.own_first
        self.first: dict[int, float] = {}
        self.peak: dict[int, float] = {}
        self.kind: dict[int, str] = {}
        self._thread.start()

    def sample(self) -> None:
        self.own_peak = max(self.own_peak, rss_mb(self.me))
        table = process_table()
        jvms = [p.pid for p in table.values() if p.ppid == self.me and p.name == "java"]
        for pid in (p.pid for jvm in jvms for p in descendants(table, jvm) if p.name.startswith("python")):
            mb = rss_mb(pid)
            if not mb:
                continue
            if pid not in self.first:
                self.first[pid] = mb
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    cmd = ""
                self.kind[pid] = "sink runner" if SINK_RUNNER in cmd else "worker"
            self.peak[pid] = max(self.peak.get(pid, 0.0), mb)

    def stop(self) -> Memory:
        self._halt()
        return self

    def of(self, kind: str) -> tuple[int, float, float]:
        """(processes, largest peak RSS, largest growth over a process's first sample) of ``kind``, in MB."""
        pids = [p for p, k in self.kind.items() if k == kind]
        if not pids:
            return 0, 0.0, 0.0
        return len(pids), max(self.peak[p] for p in pids), max(self.peak[p] - self.first[p] for p in pids)


class PhaseTwo(Periodic):
    """The mtimes of a regional store's intents and epoch records, kept as they appear (the store prunes)."""

    def __init__(self, ck: Path, interval: float = 0.1) -> None:
        super().__init__(interval)
        self.store = ck / "regional"
        self.intents: dict[int, float] = {}
        self.records: dict[int, float] = {}
        self._thread.start()

    def sample(self) -> None:
        for sub, into in (("intents", self.intents), ("epochs", self.records)):
            folder = self.store / sub
            if not folder.is_dir():
                continue
            for f in folder.iterdir():
                stem = f.name.split(".", 1)[0]
                if stem.isdigit() and int(stem) not in into:
                    try:
                        into[int(stem)] = f.stat().st_mtime
                    except OSError:
                        pass

    def stop(self) -> dict[int, float]:
        """Each epoch's seconds from its intent to its record (phase two: the produce and the transaction)."""
        self._halt()
        self.sample()
        return {e: self.records[e] - t for e, t in self.intents.items() if e in self.records}


# -- the pipelines ---------------------------------------------------------------------------------------------------


def source(spark, broker: KafkaBroker, topic: str, fmt: str, max_offsets: int | None):
    reader = spark.readStream.format(fmt)
    if fmt == "regional":
        reader = reader.option("source", "kafka")
    reader = (reader.option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", topic)
              .option("startingOffsets", "earliest"))
    if max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    return reader.load()


def start(spark, pipeline: str, broker: KafkaBroker, topic: str, out: str, ck: Path, max_offsets: int | None,
          available_now: bool):
    """Kafka into Kafka from earliest: Spark's source and sink, or regional's source and ``target=kafka``."""
    if pipeline == "stock":
        df = source(spark, broker, topic, "kafka", max_offsets).select("key", "value")
        writer = df.writeStream.format("kafka")
    else:
        df = source(spark, broker, topic, "regional", max_offsets).select("region", "offset", "key", "value")
        writer = df.writeStream.format("regional").option("target", "kafka")
    writer = (writer.option("kafka.bootstrap.servers", broker.bootstrap).option("topic", out)
              .option("checkpointLocation", str(ck)))
    return (writer.trigger(availableNow=True) if available_now else writer).start()


def copy(spark, pipeline: str, broker: KafkaBroker, topic: str, out: str, work: Path, args: argparse.Namespace,
         sample: bool = False) -> tuple[Run, dict[str, Any]]:
    broker.create_topic(out, args.partitions)
    ck = work / f"{out}-ck"
    memory: Memory | None = None
    phase_two: PhaseTwo | None = None
    if sample:
        memory, phase_two = Memory(), PhaseTwo(ck)
    began = time.perf_counter()
    query = start(spark, pipeline, broker, topic, out, ck, args.max_offsets, available_now=True)
    try:
        query.awaitTermination()
    except Exception as exc:
        if "failed to connect back" not in str(exc):
            raise
        # Spark waits 10 s for a Python worker it starts to connect back; on a loaded machine one may miss it. The
        # query restarts on its checkpoint (each pipeline's own guarantee holds across it); the time counts.
        print(f"{pipeline}: a Python worker did not connect back in time; restarting the query", flush=True)
        args.restarts.append(pipeline)
        query = start(spark, pipeline, broker, topic, out, ck, args.max_offsets, available_now=True)
        query.awaitTermination()
    seconds = time.perf_counter() - began
    extra: dict[str, Any] = {"epochs": [int(p.numInputRows) for p in query.recentProgress if p.numInputRows],
                             "phases": phases(query, seconds)}
    if memory is not None and phase_two is not None:
        memory.stop()
        extra["memory"] = {"sink runner": memory.of("sink runner"), "worker": memory.of("worker"),
                           "own": (memory.own_first, memory.own_peak)}
        extra["phase_two"] = phase_two.stop()
    total, distinct, dupes = count_output(broker, out, args.records if topic == "in" else args.warm,
                                          "read_committed" if pipeline == "regional" else "read_uncommitted")
    extra.update(total=total, distinct=distinct, dupes=dupes)
    return Run(pipeline, seconds, total), extra


# -- one producer, no Spark -------------------------------------------------------------------------------------------


def raw_producer(broker: KafkaBroker, values: list[bytes], args: argparse.Namespace, arrow: bool) -> float:
    """Seconds for ONE transactional producer (the driver's own ``EpochTransaction``) to produce ``values`` into a new
    topic, ``--max-offsets`` records a transaction, each with its marker; ``arrow``: each transaction's records go
    through an Arrow IPC stream and back to Python values first, as phase two reads a staged file."""
    topic = f"raw-{'arrow' if arrow else 'list'}"
    broker.create_topic(topic, args.partitions)
    conf = {"bootstrap.servers": broker.bootstrap, "partitioner": JAVA_PARTITIONER}
    transaction = EpochTransaction(f"bench-raw-{topic}", conf, f"bench-raw-{topic}", 60.0, failpoint="bench")
    step = args.max_offsets or len(values)
    began = time.perf_counter()
    for epoch, first in enumerate(range(0, len(values), step)):
        chunk = values[first:first + step]

        def produce(producer: Any, chunk: list[bytes] = chunk) -> int:
            if not arrow:
                for value in chunk:
                    send(producer, topic, value, None, None, -1, 60.0)
                return len(chunk)
            n = len(chunk)
            batch = pa.record_batch([pa.nulls(n, pa.binary()), pa.array(chunk, pa.binary()),
                                     pa.nulls(n, STAGED.field("headers").type), pa.array([topic] * n, pa.string()),
                                     pa.nulls(n, pa.int32())], schema=STAGED)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, STAGED) as writer:
                writer.write_batch(batch)
            table = pa.ipc.open_stream(sink.getvalue()).read_all()
            for b in table.to_batches():
                cols = [b.column(c).to_pylist() for c in ("topic", "value", "key", "headers", "partition")]
                for t, value, key, headers, partition in zip(*cols, strict=True):
                    pairs = [(h["key"], h["value"]) for h in headers] if headers else None
                    send(producer, t, value, key, pairs, -1 if partition is None else partition, 60.0)
            return n

        assert transaction.produce_once(epoch, topic, "benchmark", produce)
    return time.perf_counter() - began


# -- latency ----------------------------------------------------------------------------------------------------------


def latency_run(spark, pipeline: str, broker: KafkaBroker, work: Path, args: argparse.Namespace) -> dict[str, float]:
    from confluent_kafka import Consumer

    topic, out = f"lat-in-{pipeline}", f"lat-out-{pipeline}"
    broker.create_topic(topic, args.partitions)
    broker.create_topic(out, args.partitions)
    arrivals: list[float] = []
    stop = threading.Event()
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"lat-{pipeline}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed" if pipeline == "regional" else "read_uncommitted"})
    consumer.subscribe([out])

    def consume() -> None:
        while not stop.is_set():
            for m in consumer.consume(1000, timeout=0.1):
                if m.error() is None:
                    now = time.time()
                    arrivals.append(now - float((m.value() or b"").split(b" ", 2)[1]))

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    query = start(spark, pipeline, broker, topic, out, work / f"{out}-ck", None, available_now=False)
    try:
        deadline = time.monotonic() + 120  # the query's first (empty) batches: start-up, not latency
        while query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)
        producer = broker.producer(**{"linger.ms": "1"})
        pad = b"x" * max(args.size - 40, 0)
        seq, began = 0, time.time()
        while (now := time.time()) < began + args.latency_seconds:
            due = int((now - began) * args.rate)
            while seq < due:
                producer.produce(topic, value=b"%d %.6f " % (seq, time.time()) + pad, partition=seq % args.partitions)
                seq += 1
            producer.poll(0)
            time.sleep(0.01)
        assert producer.flush(60) == 0
        deadline = time.monotonic() + 120
        while len(arrivals) < seq and time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"{pipeline} failed: {query.exception()}")
            time.sleep(0.5)
    finally:
        query.stop()
        stop.set()
        reader.join()
        consumer.close()
    ordered = sorted(arrivals)
    result = {"sent": float(seq), "got": float(len(ordered)),
              "p50": ordered[int(0.5 * len(ordered))] if ordered else float("nan"),
              "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")}
    print(f"latency {pipeline}: p50 {result['p50']:.2f} s, p99 {result['p99']:.2f} s, {len(ordered):,} of {seq:,} "
          "records", flush=True)
    return result


# -- the report -------------------------------------------------------------------------------------------------------


def render(args: argparse.Namespace, runs: list[tuple[Run, dict[str, Any]]], raw: dict[str, float],
           latency: dict[str, dict[str, float]], elapsed: float) -> str:
    best = {name: max((r for r, _x in runs if r.pipeline == name), key=lambda r: r.rate) for name in ("stock",
                                                                                                     "regional")}
    rate = {name: args.records / best[name].seconds for name in best}
    ratio = rate["regional"] / rate["stock"]
    reg = [(r, x) for r, x in runs if r.pipeline == "regional"]
    regional_best = max(reg, key=lambda rx: rx[0].rate)
    p2 = regional_best[1]["phase_two"]
    p2_total = sum(p2.values())
    mem = regional_best[1]["memory"]
    runners, runner_peak, runner_growth = mem["sink runner"]
    workers, worker_peak, worker_growth = mem["worker"]
    own_first, own_peak = mem["own"]
    per_epoch = regional_best[1]["epochs"]
    raw_rate = {k: args.records / v for k, v in raw.items()}
    rows = [
        "| metric | stock | regional | regional/stock | goal | met |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| K->K throughput, records/s (best of {args.repeats}) | {rate['stock']:,.0f} | {rate['regional']:,.0f} | "
        f"{ratio:.2f}x | >= 1.0x stock (issue 56) | {'yes' if ratio >= 1.0 else 'no'} |",
    ]
    if latency:
        for key in ("p50", "p99"):
            lr = latency["regional"][key] / latency["stock"][key]
            rows.append(f"| latency {key} at {args.rate:,} records/s (s) | {latency['stock'][key]:.2f} | "
                        f"{latency['regional'][key]:.2f} | {lr:.2f}x | | |")
    check = "; ".join(
        f"{r.pipeline}: {x['total']:,} records read ({x['distinct']:,} distinct inputs, {x['dupes']:,} duplicates)"
        for r, x in runs)
    lines = [
        BEGIN,
        "## Kafka target: Kafka into Kafka (issue 56)",
        "",
        f"- command: `python -m benchmarks.kafka_target --records {args.records} --partitions {args.partitions} "
        f"--size {args.size} --max-offsets {args.max_offsets} --repeats {args.repeats} --latency-seconds "
        f"{args.latency_seconds}` ({elapsed / 60:.1f} min)",
        f"- machine: {os.cpu_count()} cores, Linux {platform.machine()}, Python {platform.python_version()}, load "
        f"average {os.getloadavg()[0]:.1f} at the end (absolute rates follow the machine's load; the ratios of one "
        "run count); one Kafka broker (KRaft, loopback) on the same machine",
        f"- versions: pyspark {pyspark.__version__}, stock {KAFKA_PACKAGE} (source and sink), regional "
        f"{regional.__version__} (its Kafka source, target=kafka)",
        f"- input: {args.records:,} records of {args.size} bytes over {args.partitions} partitions, output topics of "
        f"{args.partitions} partitions; Spark `local[2,4]`, both pipelines in one session, maxOffsetsPerTrigger "
        f"{args.max_offsets:,}, Trigger.AvailableNow, a warm-up pair of {args.warm:,} records first",
        "",
        *rows,
        "",
        "- every run: " + "; ".join(f"{r.pipeline} {args.records / r.seconds:,.0f} records/s ({r.seconds:.1f} s, "
                                    f"{len(x['epochs'])} epochs)" for r, x in runs),
        f"- read back: {check}. Stock is Spark's sink (at least once, read_uncommitted); regional read "
        "read_committed.",
        f"- where regional's time went (its best run, {regional_best[0].seconds:.1f} s): phase two (the driver "
        f"producing the epoch's staged records in its transaction, intent to record) {p2_total:.1f} s over "
        f"{len(p2)} epochs ({', '.join(f'{v:.1f}' for _e, v in sorted(p2.items()))} s), "
        f"{p2_total / regional_best[0].seconds:.0%} of the wall time; the rest is the tasks (reading Kafka, "
        "staging Arrow files), planning and start-up. Stock's best run: "
        f"{best['stock'].seconds:.1f} s, the tasks produce in parallel.",
        "- wall seconds by Spark's phase (`durationMs` summed over the micro-batches of the run; addBatch holds the "
        "tasks and, for regional, phase two; `outside triggers` is start-up and stop): " + "; ".join(
            f"{r.pipeline}: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(x["phases"].items()) if v >= 0.05)
            for r, x in runs),
        f"- ONE transactional producer, no Spark (regional's EpochTransaction, {args.max_offsets:,} records a "
        f"transaction, each with its marker): from a list of bytes {raw_rate['list']:,.0f} records/s "
        f"({raw['list']:.1f} s); through an Arrow IPC stream and to_pylist, as phase two does, "
        f"{raw_rate['arrow']:,.0f} records/s ({raw['arrow']:.1f} s). Phase two of the regional run: "
        f"{args.records / p2_total if p2_total else 0:,.0f} records/s.",
        f"- the driver's memory in the regional run ({', '.join(f'{n:,}' for n in per_epoch)} rows per epoch): "
        f"phase two runs in Spark's sink-runner Python worker on the driver ({runners} such process(es) seen): peak "
        f"RSS {runner_peak:,.0f} MB, growth over its first sample {runner_growth:,.0f} MB; the largest task worker "
        f"(of {workers}): peak {worker_peak:,.0f} MB, growth {worker_growth:,.0f} MB; this process (the "
        f"application's Python driver): {own_first:,.0f} -> {own_peak:,.0f} MB. Sampled from /proc every "
        "0.1 s.",
    ]
    if args.restarts:
        lines.append(f"- restarted after a Python worker missed Spark's 10 s to connect back (the machine's load), "
                     f"the restart's time counted: {', '.join(args.restarts)}")
    if latency:
        lines.append(
            f"- latency: {args.rate:,} records/s over {args.partitions} partitions for {args.latency_seconds} s per "
            "pipeline, default trigger, stock then regional, a new topic each; arrival (a consumer's receipt: "
            "read_committed for regional, read_uncommitted for stock) minus the send time in the value, over "
            "every record: " + "; ".join(f"{p} {int(v['got']):,} of {int(v['sent']):,} records"
                                          for p, v in latency.items()) + ".")
    else:
        lines.append("- latency: not measured in this run (--latency-seconds 0).")
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kafka_target", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--max-offsets", type=int, default=500_000, help="maxOffsetsPerTrigger of both pipelines")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--latency-seconds", type=int, default=60, help="0: no latency runs")
    parser.add_argument("--rate", type=int, default=1000, help="records/s of the latency runs")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    args.warm = min(args.records, 20_000)
    args.restarts = []
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="regional-bench-kafka-target-"))
    broker = KafkaBroker(work / "broker").start()
    try:
        broker.create_topic("in", args.partitions)
        broker.create_topic("warm", args.partitions)
        t = time.perf_counter()
        produce(broker, "in", args.partitions, args.records, args.size)
        produce(broker, "warm", args.partitions, args.warm, args.size)
        print(f"produced {args.records:,} records in {time.perf_counter() - t:.1f} s", flush=True)
        spark = regional.local_spark("local[2,4]", "regional-bench-kafka-target",
                                     {"spark.jars.packages": KAFKA_PACKAGE})
        regional.register(spark)
        spark.sparkContext.setLogLevel("OFF")
        for name in ("stock", "regional"):
            run, x = copy(spark, name, broker, "warm", f"warm-{name}", work, args)
            print(f"warm-up {name}: {run.rate:,.0f} records/s ({run.seconds:.1f} s)", flush=True)
        runs: list[tuple[Run, dict[str, Any]]] = []
        for i in range(args.repeats):
            for name in ("stock", "regional"):
                run, x = copy(spark, name, broker, "in", f"out-{name}-{i}", work, args, sample=name == "regional")
                if name == "regional":
                    assert x["total"] == x["distinct"] == args.records, f"regional: {x}"
                else:
                    assert x["distinct"] == args.records, f"stock: {x}"
                runs.append((run, x))
                print(f"{name}: {args.records / run.seconds:,.0f} records/s ({run.seconds:.1f} s), epochs "
                      f"{x['epochs']}, read back {x['total']:,}", flush=True)
        t = time.perf_counter()
        values = [b"%012d-%010d-" % (i, i % args.partitions) + b"x" * max(args.size - 24, 0)
                  for i in range(args.records)]
        raw = {"list": raw_producer(broker, values, args, arrow=False),
               "arrow": raw_producer(broker, values, args, arrow=True)}
        del values
        print(f"one producer: list {args.records / raw['list']:,.0f}, arrow {args.records / raw['arrow']:,.0f} "
              f"records/s", flush=True)
        latency: dict[str, dict[str, float]] = {}
        if args.latency_seconds:
            for name in ("stock", "regional"):
                latency[name] = latency_run(spark, name, broker, work, args)
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    elapsed = time.perf_counter() - began
    dump = Path(tempfile.gettempdir()) / "regional-bench-kafka-target.json"
    dump.write_text(json.dumps({"args": vars(args), "runs": [(r.__dict__, x) for r, x in runs], "raw": raw,
                               "latency": latency, "elapsed": elapsed}, default=str))
    print(f"results: {dump}", flush=True)
    section = render(args, runs, raw, latency, elapsed)
    write_section(Path(args.out), "kafka-target", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
