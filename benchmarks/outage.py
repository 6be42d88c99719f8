"""An outage on a wall-clock timer: how long until every region is current again, regional next to stock Spark
restarted by a supervisor, in the same run (issue 45).

    python -m benchmarks.outage [--regions 8] [--rate 250] [--outage 60] [--warmup 15] [--some 2] [--repeats 1]

A feeder writes, every second, one text file of ``--rate`` lines into each of ``--regions`` region directories
(``<region> <tick> <line> <padding>``; written aside, then renamed in). Both pipelines read them with the default
trigger (the next batch as soon as the last ends) through the same Python UDF, which calls a "service" that is
down (raises ConnectionError) for a region while a flag file of that region exists, and write a Delta table:
regional (``source=files`` -> ``target=delta``, ``deadLetterPath``, every other setting its default: the
defaults' ``deadLetterRetries=4``, ``deadLetterRetryBackoff=1m``) and stock Spark (text source -> Delta). Both
run under the same supervisor loop, which restarts a query that failed (as users' supervisors do; stock Spark
needs it, regional should not).

The outage is a timer that knows nothing of epochs: ``--warmup`` seconds after the pipeline keeps up with the feed
(every second's lines up to 3 s ago in the table), the flag files appear; ``--outage`` seconds later they go,
wherever each query is then. Two cases: the service down for every region, and for ``--some`` of them (a shard).
Measured from the tables themselves (each commit's ``commitInfo.timestamp`` in ``_delta_log``, and the rows each
commit added), the same way for both:

- recovery: seconds from the outage's end until every record written before it is in the table (every region
  current); next to it, the normal lag before the outage (the median over the warm-up's seconds of the time until
  that second's records are all in the table);
- during a shard's outage: the healthy regions' committed rows/s, against the rate they were fed;
- regional's dead letters: must be 0 (a healthy record dead-lettered is a bug of the evidence rule: its epoch
  records are printed and reported);
- exactly once: the feeder is stopped, each query drains, and the table is read back with Spark's Delta reader:
  every line written is there once, upper-cased.

Writes the outage section of BENCHMARKS.md and prints it. Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

import pyspark

import regional
from benchmarks.common import EpochRecorder
from benchmarks.dead_letters import udf_error
from benchmarks.sections import markers, write_section
from regional.protocol.settings import DEFAULTS

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = markers("outage")
PAD = "x" * 60
STEADY_S = 180.0  # how long a pipeline may take to keep up with the feed before the outage starts anyway


class Feeder:
    """Every second, one file of ``rate`` lines per region: written aside, renamed into the region's directory
    (both sources then see it whole). ``written[tick]`` is the wall-clock time by which every region's file of
    that tick was in place."""

    def __init__(self, inp: Path, aside: Path, regions: list[str], rate: int) -> None:
        self.inp, self.aside, self.regions, self.rate = inp, aside, regions, rate
        self.written: dict[int, float] = {}
        self._stop = threading.Event()
        for region in regions:
            (inp / region).mkdir(parents=True, exist_ok=True)
        aside.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        began = time.monotonic()
        tick = 0
        while not self._stop.is_set():
            for region in self.regions:
                name = f"{tick:06d}.txt"
                lines = "".join(f"{region} {tick:06d} {i:06d} {PAD}\n" for i in range(self.rate))
                (self.aside / f"{region}-{name}").write_text(lines)
                os.rename(self.aside / f"{region}-{name}", self.inp / region / name)
            self.written[tick] = time.time()
            tick += 1
            self._stop.wait(max(0.0, began + tick - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def last_tick_before(self, t: float) -> int:
        return max(k for k, at in self.written.items() if at <= t)


class TableWatcher:
    """Reads a Delta table's commits as they appear: when each ``(region, tick)`` had all its lines in the table
    (the commit's ``commitInfo.timestamp``), and each commit's rows per region. Each data file is read once."""

    def __init__(self, table: Path, rate: int) -> None:
        self.table, self.rate = table, rate
        self.version = -1
        self.counts: Counter[tuple[str, int]] = Counter()
        self.complete_at: dict[tuple[str, int], float] = {}
        self.commits: list[tuple[float, Counter[str]]] = []  # (timestamp, rows added per region)

    def poll(self) -> None:
        import pyarrow.parquet as pq

        log = self.table / "_delta_log"
        while (entry := log / f"{self.version + 1:020d}.json").exists():
            try:
                actions = [json.loads(line) for line in entry.read_text().splitlines() if line.strip()]
            except (OSError, ValueError):
                return  # being written: the next poll reads it
            stamp = next((a["commitInfo"].get("timestamp") for a in actions if "commitInfo" in a), None)
            at = stamp / 1000.0 if stamp is not None else entry.stat().st_mtime
            added: Counter[str] = Counter()
            for action in actions:
                if "add" in action:
                    path = self.table / urllib.parse.unquote(action["add"]["path"])
                    for value in pq.read_table(path, columns=["value"]).column("value").to_pylist():
                        region, tick = value.split(" ", 2)[:2]
                        key = (region.lower(), int(tick))
                        self.counts[key] += 1
                        added[key[0]] += 1
                        if self.counts[key] == self.rate:
                            self.complete_at[key] = at
            self.commits.append((at, added))
            self.version += 1

    def current_at(self, regions: list[str], last_tick: int) -> float | None:
        """When every region's lines up to ``last_tick`` were in the table; None while they are not."""
        times = [self.complete_at.get((r, k)) for r in regions for k in range(last_tick + 1)]
        return None if any(t is None for t in times) else max(t for t in times if t is not None)

    def rows_until(self, regions: set[str], t: float) -> int:
        return sum(n for at, added in self.commits if at <= t for r, n in added.items() if r in regions)


def service_udf(flags: Path):
    """Upper-cases through a service that is down for a region while its flag file exists."""
    from pyspark.sql import functions as F

    root = str(flags)

    @F.udf("string")
    def call(region: str, value: str) -> str:
        if os.path.exists(os.path.join(root, region)):
            raise ConnectionError(f"the service behind region {region} is down (benchmark outage)")
        return value.upper()

    return call


def start_query(spark, pipeline: str, inp: Path, d: Path, flags: Path):
    from pyspark.sql import functions as F

    call = service_udf(flags)
    if pipeline == "stock":
        df = (spark.readStream.format("text").load(str(inp / "*" / "*.txt"))
              .withColumn("region", F.substring_index("value", " ", 1)))  # every line starts with its region
        return (df.select(call("region", "value").alias("value")).writeStream.format("delta")
                .option("checkpointLocation", str(d / "ck")).start(str(d / "out")))
    df = spark.readStream.format("regional").option("source", "files").option("path", str(inp)).load()
    return (df.select("region", "offset", call("region", "value").alias("value")).writeStream.format("regional")
            .option("target", "delta").option("path", str(d / "out")).option("checkpointLocation", str(d / "ck"))
            .option("deadLetterPath", str(d / "dead")).start())


class Supervised:
    """A query restarted from its checkpoint whenever it has failed, checked every 0.2 s by ``step``."""

    def __init__(self, starter) -> None:
        self.starter = starter
        self.query = starter()
        self.restarts = 0
        self.errors: list[str] = []

    def step(self) -> None:
        if not self.query.isActive:
            exc = self.query.exception()
            self.errors.append(udf_error(exc) if exc is not None else "stopped")
            self.restarts += 1
            self.query = self.starter()

    def stop(self) -> None:
        self.query.stop()


def run_case(spark, pipeline: str, scope: list[str], regions: list[str], work: Path,
             args: argparse.Namespace) -> dict[str, Any]:
    d = work / f"{pipeline}-{len(scope)}"
    inp, flags = d / "in", d / "service-down"
    flags.mkdir(parents=True)
    feeder = Feeder(inp, d / "aside", regions, args.rate)
    recorder = EpochRecorder(d / "ck") if pipeline == "regional" else None
    watcher = TableWatcher(d / "out", args.rate)
    supervised = Supervised(lambda: start_query(spark, pipeline, inp, d, flags))

    def supervise(until, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{pipeline}, outage of {len(scope)} regions: no progress in {timeout:.0f} s "
                                   f"({supervised.errors[-1:] or 'no error'})")
            supervised.step()
            watcher.poll()
            time.sleep(0.2)

    try:
        # Steady first: the start-up's backlog drained (every second's records up to 3 s ago are in the table), so
        # that the outage meets a pipeline that keeps up, not one still catching up with its own start.
        def steady() -> bool:
            recent = [k for k, at in feeder.written.items() if at < time.time() - 3]
            return bool(recent) and watcher.current_at(regions, max(recent)) is not None

        started = time.time()
        try:
            supervise(steady, STEADY_S)
        except TimeoutError:
            pass  # it never kept up: the outage starts anyway, and the normal lag below says so
        steady_after = time.time() - started
        warm_from = time.time()
        warm_until = warm_from + args.warmup
        supervise(lambda: time.time() >= warm_until, args.warmup + 60)
        for region in scope:
            (flags / region).touch()
        down_at = time.time()
        supervise(lambda: time.time() >= down_at + args.outage, args.outage + 60)
        for region in scope:
            (flags / region).unlink()
        up_at = time.time()
        last = feeder.last_tick_before(up_at)
        supervise(lambda: watcher.current_at(regions, last) is not None, 900)
        current_at = watcher.current_at(regions, last)
        assert current_at is not None
        tail_until = time.time() + 5  # a few seconds of the stream after recovery, then drain
        supervise(lambda: time.time() >= tail_until, 60)
        feeder.stop()
        final = max(feeder.written)
        supervise(lambda: watcher.current_at(regions, final) is not None, 600)
    finally:
        feeder.stop()
        supervised.stop()
        epochs = recorder.stop() if recorder is not None else []
    # The normal lag: seconds of the warm-up, past the start-up's backlog and before the outage could touch them.
    before_down = [k for k, at in feeder.written.items() if warm_from + 2 < at < down_at - 3]
    lags = [max(watcher.complete_at[(r, k)] for r in regions) - feeder.written[k] for k in before_down
            if all((r, k) in watcher.complete_at for r in regions)]
    healthy = set(regions) - set(scope)
    window = up_at - down_at
    result: dict[str, Any] = {
        "pipeline": pipeline, "scope": len(scope), "recovery": current_at - up_at, "window": window,
        "lag": statistics.median(lags) if lags else float("nan"),
        "healthy_rate": (watcher.rows_until(healthy, up_at) - watcher.rows_until(healthy, down_at)) / window,
        "offered": args.rate * len(healthy), "restarts": supervised.restarts,
        "error": supervised.errors[0] if supervised.errors else None,
        "lines": len(feeder.written) * len(regions) * args.rate, "commits": len(watcher.commits),
        "steady_after": steady_after,
    }
    result.update(read_back(spark, d, regions, feeder, args.rate))
    if pipeline == "regional":
        result.update(regional_evidence(spark, d, epochs, down_at, up_at))
    return result


def read_back(spark, d: Path, regions: list[str], feeder: Feeder, rate: int) -> dict[str, Any]:
    """The table read back with Spark's Delta reader: every line written once, upper-cased, nothing else."""
    values = spark.read.format("delta").load(str(d / "out")).select("value").toArrow().column("value").to_pylist()
    seen = Counter(values)
    expected = {f"{r} {k:06d} {i:06d} {PAD}".upper() for r in regions for k in feeder.written for i in range(rate)}
    missing = len(expected - seen.keys())
    doubled = sum(n - 1 for n in seen.values() if n > 1)
    foreign = len(seen.keys() - expected)
    return {"rows": len(values), "missing": missing, "doubled": doubled, "foreign": foreign,
            "exactly_once": missing == 0 and doubled == 0 and foreign == 0}


def regional_evidence(spark, d: Path, epochs: list[Any], down_at: float, up_at: float) -> dict[str, Any]:
    """Regional's epochs: its dead letters (from the records and the dead-letter table), how it waited."""
    lettered = [e for e in epochs if e.dead_lettered]
    table = d / "dead" / "_delta_log"
    dead_rows = spark.read.format("delta").load(str(d / "dead")).count() if table.exists() else 0
    findings = []
    for e in lettered:  # a healthy record dead-lettered: the evidence rule's bug, with what its record says
        for region, letter in e.dead_lettered.items():
            state = e.regions.get(region)
            findings.append({"epoch": e.epoch, "at_s_after_down": round(e.recorded_at - down_at, 2),
                             "at_s_after_up": round(e.recorded_at - up_at, 2), "region": region,
                             "offset": letter.offset, "error": letter.error,
                             "state": state._asdict() if state is not None else None})
    for finding in findings:
        print("DEAD-LETTERED (a healthy record: a bug of the evidence rule):", json.dumps(finding, default=str),
              flush=True)

    def median_gap(records: list[Any]) -> float:
        gaps = [b.recorded_at - a.recorded_at for a, b in itertools.pairwise(records)]
        return statistics.median(gaps) if gaps else float("nan")

    during = [e for e in epochs if down_at <= e.recorded_at <= up_at]
    before = [e for e in epochs if e.recorded_at < down_at][-10:]
    return {"dead": sum(len(e.dead_lettered) for e in epochs), "dead_rows": dead_rows, "findings": findings,
            "epochs_during": len(during), "epoch_s_during": median_gap(during), "epoch_s_before": median_gap(before),
            "epochs": len(epochs), "missing_records": (epochs[-1].epoch + 1 - len(epochs)) if epochs else 0,
            "outage_epochs": max((e.outage_epochs for e in epochs), default=0),
            "waiting": sum(1 for e in epochs for f in e.fallen_back.values() if "outage" in (f.reason or ""))}


def render(args: argparse.Namespace, results: list[dict[str, Any]], elapsed: float,
           load: tuple[float, float] = (float("nan"), float("nan"))) -> str:
    def cell(pipeline: str, scope: int, fmt) -> str:
        runs = [r for r in results if r["pipeline"] == pipeline and r["scope"] == scope]
        return ", ".join(fmt(r) for r in runs) if runs else "-"

    def seconds(key: str):
        return lambda r: f"{r[key]:.1f}"

    def rate(r: dict[str, Any]) -> str:
        return f"{r['healthy_rate']:,.0f} of {r['offered']:,} fed ({r['healthy_rate'] / r['offered']:.2f}x)"

    def once(r: dict[str, Any]) -> str:
        return ("yes" if r["exactly_once"] else
                f"**NO**: {r['missing']:,} missing, {r['doubled']:,} doubled, {r['foreign']:,} unknown") \
            + f" ({r['rows']:,} rows)"

    def dead(r: dict[str, Any]) -> str:
        n = max(r["dead"], r["dead_rows"])
        return "0" if n == 0 else f"**{n}** (a bug: see below)"

    s = args.some
    every = args.regions
    lines = [
        BEGIN,
        "## An outage on a wall-clock timer: time until every region is current again (issue 45)",
        "",
        f"- command: `python -m benchmarks.outage --regions {every} --rate {args.rate} --outage {args.outage:g} "
        f"--warmup {args.warmup:g} --some {s} --repeats {args.repeats}` ({elapsed / 60:.1f} min)",
        f"- machine: 2 cores, Linux {platform.machine()}, Python {platform.python_version()}; pyspark "
        f"{pyspark.__version__}, `local[2,4]`, one session for every pipeline, the default trigger; load average "
        f"(1 min) at the start and the end: {load[0]:.1f}, {load[1]:.1f} (other work shared the 2 cores)",
        f"- input: a feeder writes every second one file of {args.rate:,} lines per region into {every} region "
        f"directories ({every * args.rate:,} lines/s); one Python UDF in both pipelines calls a service that "
        "raises ConnectionError for a region while its flag file exists",
        f"- the outage: a timer, {args.warmup:g} s after the pipeline keeps up (every second's lines up to 3 s ago in "
        "the table, or 180 s after its start if it never does), creates the flag files of every "
        f"region, or of {s} of the {every}, and removes them {args.outage:g} s later, wherever the queries are then "
        "(in an epoch, between a task's attempts, in a back-off)",
        "- regional: `source=files` -> `target=delta` with `deadLetterPath` and every other setting its default "
        f"(deadLetterRetries={DEFAULTS['deadLetterRetries']}, deadLetterRetryBackoff="
        f"{DEFAULTS['deadLetterRetryBackoff']}, regionAttempts={DEFAULTS['regionAttempts']}, "
        f"maxConsecutiveFailures={DEFAULTS['maxConsecutiveFailures']}); stock: Spark's text source -> delta-spark. "
        "Both under a supervisor loop that restarts a failed query from its checkpoint (checked every 0.2 s)",
        "- measured from each table's `_delta_log` (the commits' `commitInfo.timestamp` and the rows each added), "
        "the same for both; exactly once: after the outage the feeder stops, the query drains, and Spark's Delta "
        "reader reads the table back",
        "",
        "| outage of | pipeline | s from the outage's end until every region is current | normal lag before the "
        "outage (s, median) | healthy regions' committed rows/s during the outage | restarts by the supervisor | "
        "records dead-lettered | every record once |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scope, label in ((every, f"all {every} regions"), (s, f"{s} of {every} regions")):
        for pipeline in ("stock", "regional"):
            lines.append(
                f"| {label} | {'stock Spark + supervisor' if pipeline == 'stock' else 'regional (defaults)'} | "
                f"{cell(pipeline, scope, seconds('recovery'))} | {cell(pipeline, scope, seconds('lag'))} | "
                f"{cell(pipeline, scope, rate) if scope < every else '- (none healthy)'} | "
                f"{cell(pipeline, scope, lambda r: str(r['restarts']))} | "
                f"{cell(pipeline, scope, dead) if pipeline == 'regional' else '- (no dead letters)'} | "
                f"{cell(pipeline, scope, once)} |")
    lines.append("")
    for r in results:
        extra = (f"; {r['epochs']} epochs, {r['epochs_during']} of them during the outage (median "
                 f"{r['epoch_s_during']:.2f} s apart, {r['epoch_s_before']:.2f} s before it), at most "
                 f"{r['outage_epochs']} outage epochs in a row, {r['waiting']} region-epochs waiting as "
                 "`looks like an outage`"
                 + (f" ({r['missing_records']} epoch records not seen)" if r.get("missing_records") else "")
                 if r["pipeline"] == "regional" else "")
        kept = (f"the pipeline kept up {r['steady_after']:.0f} s after its start; " if r["steady_after"] < STEADY_S
                else f"the pipeline had not kept up {STEADY_S:.0f} s after its start (it never caught up with the "
                     "feed: its recovery includes its own backlog); ")
        lines.append(f"- {r['pipeline']}, outage of {r['scope']} of {every} regions: the outage lasted "
                     f"{r['window']:.1f} s; {kept}{r['commits']} commits, {r['lines']:,} lines fed{extra}"
                     + (f"; first error the supervisor saw: `{r['error']}`" if r["error"] else "") + ".")
    findings = [f for r in results for f in r.get("findings", [])]
    if findings:
        lines.append("- **healthy records dead-lettered** (the evidence rule's bug; each with its region's state in "
                     "that epoch's record):")
        lines += [f"  - `{json.dumps(f, default=str)}`" for f in findings]
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.outage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regions", type=int, default=8)
    parser.add_argument("--rate", type=int, default=250, help="lines per region per second")
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the service is down")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds from keeping up to the outage")
    parser.add_argument("--some", type=int, default=2, help="regions down in the second case")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    if not 0 < args.some < args.regions:
        parser.error("--some must be between 1 and --regions - 1")
    regions = [f"r{i:02d}" for i in range(args.regions)]
    began, load_before = time.perf_counter(), os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="regional-bench-outage-"))
    results = []
    try:
        spark = regional.local_spark("local[2,4]", "regional-bench-outage", {"spark.sql.shuffle.partitions": "2"})
        regional.register(spark)
        spark.sparkContext.setLogLevel("OFF")
        try:
            for i in range(args.repeats):
                for scope in (regions, regions[:args.some]):
                    for pipeline in ("stock", "regional"):
                        result = run_case(spark, pipeline, scope, regions, work / str(i), args)
                        print({k: v for k, v in result.items() if k != "findings"}, flush=True)
                        results.append(result)
        finally:
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_section(Path(args.out), "outage", render(args, results, time.perf_counter() - began,
                                            (load_before, os.getloadavg()[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
