"""Side-by-side benchmarks of ``regional`` against stock Spark: one command, one run, one machine.

    .venv/bin/python -m benchmarks.run --quick     # small sizes, a few minutes
    .venv/bin/python -m benchmarks.run             # the full run: scenario 1 at 4M records

Scenarios, one module each: 1 ``throughput`` (at volume, with memory), 2 ``failing_region``, 3 ``straggler``,
4 ``many_regions``, 5 ``transient`` (wasted work); then the Kafka source (``kafka``), the Kafka target
(``kafka_target``), the PostgreSQL target
(``postgres``), dead letters (``dead_letters``), a bad file among good ones (``bad_file``) and an outage on a
timer (``outage``), each in its own
SparkSession (they need other jars).
Writes ``BENCHMARKS.md`` (with the machine and the versions) and ``benchmarks/scenario2.png``.
Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)

import regional  # noqa: E402
from benchmarks import failing_region, many_regions, straggler, throughput, transient  # noqa: E402
from benchmarks.common import FULL, QUICK, Mode, Row, write_input  # noqa: E402
from benchmarks.sections import markers  # noqa: E402

# The modules with a section of their own, and their arguments in each mode.
OTHERS = {
    "kafka": (["--records", "200000", "--repeats", "1"], ["--records", "2000000", "--repeats", "2"]),
    "postgres": (["--rows", "100000", "--repeats", "1"], ["--rows", "4000000", "--repeats", "3"]),
    "dead_letters": (["--per-region", "5000"], ["--per-region", "20000"]),
    "bad_file": (["--per-region", "5000"], ["--per-region", "20000"]),
    "outage": (["--outage", "20"], ["--outage", "60"]),
    "s3": (["--rows-per-file", "10000", "--files-per-region", "2", "--repeats", "1"],
           ["--rows-per-file", "62500", "--files-per-region", "4", "--repeats", "3"]),
    "latency": (["--seconds", "10", "--repeats", "1"], ["--seconds", "40", "--repeats", "3"]),
    "kafka_partitions": (["--partitions", "100", "--bursts", "3", "--records", "20000", "--repeats", "1"], []),
    "kafka_target": (["--records", "200000", "--max-offsets", "50000", "--latency-seconds", "15"],
                     ["--records", "2000000", "--max-offsets", "500000", "--latency-seconds", "60"]),
}


def session():
    return regional.local_spark("local[2,4]", "regional-benchmarks", {
        "spark.sql.shuffle.partitions": "2",
        # Both pipelines share this JVM: 1 GB (the default) makes stock Spark's Delta writes GC-bound at volume.
        "spark.driver.memory": "4g"})


def run_scenarios(only: str, mode: Mode, work: Path, out: Path) -> list[Row]:
    rows: list[Row] = []
    spark = session()
    regional.register(spark)
    spark.sparkContext.setLogLevel("OFF")
    try:
        if "1" in only:
            rows += throughput.run(spark, work, mode)
            print(rows[-1], flush=True)
        if set(only) & set("25"):
            inp = work / "in"
            total = write_input(inp, mode.rows_per_file, mode.files_per_region)
            if "2" in only:
                rows += failing_region.run(spark, work, mode, inp, out / "benchmarks" / "scenario2.png")
                print(rows[-1], flush=True)
            if "5" in only:
                rows += transient.run(spark, work, mode, inp, total)
                print(rows[-1], flush=True)
        if "3" in only:
            rows += straggler.run(spark, work, mode)
            print(rows[-1], flush=True)
        if "4" in only:
            rows += many_regions.run(spark, work, mode)
            print(*rows[-2:], sep="\n", flush=True)
    finally:
        spark.stop()
    return sorted(rows, key=lambda r: r.scenario)


def render(rows: list[Row], command: str, mode: Mode, elapsed: float) -> str:
    from benchmarks.common import environment

    lines = [
        "# Benchmarks",
        "",
        *environment(command, mode, elapsed),
        f"- date: {datetime.date.today().isoformat()}",
        "- Spark `local[2,4]`, driver memory 4g, default Arrow batch sizes (scenario 3 sets "
        "`maxRecordsPerBatch=100`); stock and regional in the same session, on the same input, in the same run.",
        "",
        "| scenario | metric | stock | regional | ratio | goal | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {r.scenario} | {r.metric} | {r.stock} | {r.regional} | {r.ratio} | {r.goal} | {r.met} |"
              for r in rows]
    lines += ["", "Notes:", ""]
    lines += [f"- {r.scenario.split('.')[0]}: {n}" for r in rows for n in r.notes]
    lines += ["", READING]
    return "\n".join(lines) + "\n"


READING = """## Reading the results (written by hand; the numbers above are from the run)

- Scenario 2: regional keeps committing the 15 healthy regions while stock Spark commits nothing in the
  window (every restart fails the same batch again). Until 2026-11-23 the failing region's sink returned
  without taking the rest of its input, so Spark did not reuse its Python worker and every epoch forked and
  imported a new one (0.83x of fault-free); it now drains its input.
- Scenario 3: `regionTimeout` cuts in the source, but what is already between the source and the UDF when
  the clock runs out is still processed and published (Spark moves it through the task's operators), and a
  source that waits for the sink stalls the whole task. So the cut alone saved nothing here (every range fits
  in those buffers); a straggler's *next* ranges are sized to what it did per `regionTimeout` instead. The
  first epoch still waits for it; later epochs carry its smaller ranges, and its own backlog drains in
  more, shorter epochs (the whole run, its tail included, takes longer than without the timeout).
- Scenario 4b: when all 10,000 regions have new data, the driver reads, plans, decides and writes every
  region's state each epoch (records hold region states as columns; the per-region values are NamedTuples):
  the floor of a few tens of ms each. Publishing the 10,000 staged files is the larger part: delta-rs's own
  calls alone (bring the table up to date with the previous epoch's 10,000 adds, read the app transaction,
  commit 10,000 adds) take 80-116 ms, and they grow as the table does (a probe of delta-rs alone, 10,000 adds
  per version: 51 ms at version 2, 95 ms at version 12). So the goal of 100 ms for all of it cannot be met
  with delta-rs as the publisher, whatever regional does. With 10 regions of 10,000 having data, an epoch
  takes 44 ms, of which delta-rs 9 ms: the cost follows the regions with work, not the regions known.
"""

KEPT_SECTIONS = tuple(OTHERS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and one repeat")
    parser.add_argument("--only", default="12345", help="scenarios of this module to run, e.g. 14")
    parser.add_argument("--with", dest="others", default=",".join(OTHERS),
                        help=f"the other modules to run too, comma-separated, from {','.join(OTHERS)} ('' for none)")
    parser.add_argument("--out", default=str(ROOT), help="where BENCHMARKS.md and the PNG go")
    parser.add_argument("--repeats", type=int, help="counted runs per scenario (after the warm-up), instead of the "
                        "mode's")
    args = parser.parse_args(argv)
    mode = QUICK if args.quick else FULL
    if args.repeats:
        mode = dataclasses.replace(mode, repeats=args.repeats)
    command = " ".join(["python -m benchmarks.run", *map(shlex.quote, argv if argv is not None else sys.argv[1:])])
    out = Path(args.out)
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="regional-bench-"))
    try:
        rows = run_scenarios(args.only, mode, work, out) if args.only else []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    target = out / "BENCHMARKS.md"
    if rows:
        report = render(rows, command, mode, time.perf_counter() - began)
        previous = target.read_text() if target.exists() else ""
        # The other modules' sections stay until they run again: every module's, those that run.py does not run too
        # (monitoring, replay).
        names = dict.fromkeys([*(n.replace("_", "-") for n in KEPT_SECTIONS),
                               *re.findall(r"<!-- ([a-z0-9-]+):begin -->", previous)])
        for name in names:
            begin, end = markers(name)
            if begin in previous and end in previous:
                report += "\n" + previous[previous.index(begin):previous.index(end) + len(end)] + "\n"
        target.write_text(report)
        print(report)
        (out / "benchmarks").mkdir(parents=True, exist_ok=True)
        (out / "benchmarks" / "last-run.json").write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    others = [name for name in args.others.split(",") if name]
    for name in others:
        if name not in OTHERS:
            parser.error(f"--with: no module {name!r}; choose from {','.join(OTHERS)}")
    for name in others:
        # A process of its own: each needs jars of its own (spark.jars.packages), which a JVM that is already
        # running (this process's, from the scenarios above) does not load ("Failed to find data source: kafka").
        subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *OTHERS[name][0 if args.quick else 1],
                        "--out", str(target)], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
