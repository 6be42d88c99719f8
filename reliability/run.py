"""The reliability campaign, one command; writes its sections of RELIABILITY.md (or ``--report``).

    .venv/bin/python -m reliability.run                       # everything: about 4 hours on 2 cores
    .venv/bin/python -m reliability.run --only kills --trials 4   # a short run of the random kills
    .venv/bin/python -m reliability.run --only soak --soak-epochs 100   # a short soak

Three parts:

- ``kills``: each target (delta, the python committer ``regional.testing.committer.EpochFilesTarget``,
  postgres, and delta-s3: delta with the checkpoint and the table on s3proxy, its own section) gets ``--trials``
  random driver kills, half reading the files source and half a Kafka topic
  (``reliability.random_kills``); it starts its own Kafka broker and PostgreSQL server on loopback addresses.
- ``checks``: the campaign's pytest modules with ``REGIONAL_CAMPAIGN=1`` (the standalone cluster with executor
  and worker loss, store fuzzing, bad input, two drivers on one checkpoint, every kill point of the crash tests,
  outages on timers of every scope up to 5 minutes),
  each test's outcome and time in the report.
- ``soak``: one query on 64 Kafka partitions for ``--soak-epochs`` epochs (or ``--soak-minutes``) under failing
  targets, poison records, slow records, outages on timers and driver kills, its resources sampled and plotted
  (``docs/soak.png``), then checked record by record (``reliability.soak``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
os.environ["PYSPARK_PYTHON"] = sys.executable  # Python workers run this interpreter

from benchmarks.sections import markers, write_section  # noqa: E402

from reliability.random_kills import EPOCH_WINDOW_S, PHASE_TWO_SHARE, START_SHARE, START_WINDOW_S, Series, run_series  # noqa: E402

TARGETS = ("delta", "python", "postgres", "kafka", "delta-s3")
S3_LEASE_TTL_S = "10"  # a killed driver's lease holds up the next start this long (the default is 30 s)
SOURCES = ("files", "kafka")
CHECKS = ["integration/test_standalone_cluster.py", "tests/test_store_fuzz.py", "integration/test_bad_input.py",
          "integration/test_crash_safety.py", "integration/test_outages.py", "integration/test_postgres_target.py::"
          "test_sigkill_of_the_driver_at_each_step_of_phase_two_then_a_restart",
          "integration/test_dead_letters.py::"
          "test_sigkill_of_the_driver_while_it_dead_letters_then_restart_lands_every_record_once"]
HEADER = """# Reliability

What the reliability campaign (`python -m reliability.run`, see the README) measured: random kills of the
driver against each target and source, checked record by record by `regional.testing.exactly_once`, and the
campaign's tests (a Spark standalone cluster losing executors and a worker, store fuzzing, bad input, two
drivers on one checkpoint, outages on timers), and a soak under faults, outages on timers and kills with its
resources plotted. Each section says the command and the run that wrote it.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="kills,checks,soak", help="a comma-separated subset of kills,checks,soak")
    parser.add_argument("--trials", type=int, default=50, help="random-kill trials per target (split across sources)")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--parallel", type=int, default=3, help="targets whose kills run at once")
    parser.add_argument("--soak-epochs", type=int, default=1000)
    parser.add_argument("--soak-minutes", type=float, default=None, help="end the soak after this long, if sooner")
    parser.add_argument("--soak-target", default="delta", choices=["delta", "kafka"],
                        help="the soak's target (kafka: section soak-kafka)")
    parser.add_argument("--soak-no-kills", action="store_true",
                        help="one driver for the whole soak (section soak-no-kills): resources over one long run")
    parser.add_argument("--report", type=Path, default=ROOT / "RELIABILITY.md")
    parser.add_argument("--work", type=Path, default=None, help="work directory (default: a temporary one)")
    args = parser.parse_args()
    command = ("python -m reliability.run " + " ".join(sys.argv[1:])).strip()
    work = args.work or Path(tempfile.mkdtemp(prefix="regional-reliability-"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.report.exists():
        args.report.write_text(HEADER)
    revision()
    ok = True
    if "kills" in args.only:
        ok &= kills(args, command, work)
    if "checks" in args.only:
        ok &= checks(args.report, command, work)
    if "soak" in args.only:
        ok &= soak(args, command, work)
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"FAILED: work directory kept in {work}", flush=True)
        sys.exit(1)


@functools.cache  # main() calls it first, so every section names what the campaign started on
def revision() -> str:
    """The commit the campaign runs, and whether the tree it runs differs from it (anything tracked or new but the
    files the campaign itself writes)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--", ".", ":!RELIABILITY.md", ":!docs/soak*.png")
    return f"commit {commit}" + (" with uncommitted changes" if changed else "")


def kills(args: argparse.Namespace, command: str, work: Path) -> bool:
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    targets = [t for t in args.targets.split(",") if t]
    started = time.monotonic()
    lock = threading.Lock()

    def say(line: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {line}"
        with lock:
            print(line, flush=True)
            with open(work / "campaign.log", "a") as f:
                f.write(line + "\n")

    from regional.testing.kafka_broker import KafkaBroker
    from regional.testing.postgres_server import PostgresServer

    broker = KafkaBroker(work / "kafka").start()
    postgres = PostgresServer().start() if "postgres" in targets else None
    s3 = None
    if any(t.endswith("-s3") for t in targets):
        import json

        from regional.storage.config import STORAGE_CONF_ENV
        from regional.testing.s3_server import S3Server

        s3 = S3Server(work / "s3").start()
        os.environ[STORAGE_CONF_ENV] = json.dumps(s3.hadoop_conf())  # the checker reads the S3 tables
        os.environ["REGIONAL_LEASE_TTL_S"] = S3_LEASE_TTL_S

    def one_target(t: int, target: str) -> list[Series]:
        done = []
        sources = ("kafka",) if target == "stock-kafka" else SOURCES  # the control reads Kafka only
        for s, source in enumerate(sources):
            trials = args.trials // len(sources) + (s < args.trials % len(sources))
            done.append(run_series(target, source, trials, seed + 10 * t + s, work / f"{target}-{source}",
                                   broker=broker, postgres=postgres, say=say,
                                   s3=s3 if target.endswith("-s3") else None))
        return done

    series: list[Series] = []
    try:
        # The targets side by side: a trial is mostly a driver starting (processes spawned one after another),
        # so three at once use two cores better than one.
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            for done in pool.map(one_target, range(len(targets)), targets):
                series.extend(done)
    finally:
        broker.stop()
        if postgres is not None:
            postgres.remove()
        if s3 is not None:
            s3.stop()
    elapsed = time.monotonic() - started
    local = [s for s in series if not s.target.endswith("-s3")]
    on_s3 = [s for s in series if s.target.endswith("-s3")]
    if local:
        write_section(args.report, "kills", kills_section(local, command, seed, elapsed))
    if on_s3:
        write_section(args.report, "kills-s3", kills_section(on_s3, command, seed, elapsed, s3=True))
    return all(s.ok for s in series)


def kills_section(series: list[Series], command: str, seed: int, elapsed: float, s3: bool = False) -> str:
    import pyspark

    import regional

    begin, end = markers("kills-s3" if s3 else "kills")
    lines = [
        begin,
        "## Random kills of the driver, everything on S3" if s3 else "## Random kills of the driver",
        "",
        *([f"The checkpoint (regional's store and Spark's offset log), the Delta table and the files source's input "
           f"on s3proxy 4.1.0 (loopback, s3a:// for Spark, obstore and delta-rs for regional), the lease set to "
           f"{S3_LEASE_TTL_S} s (`REGIONAL_LEASE_TTL_S`). Otherwise as below.", ""] if s3 else []),
        f"Written by `{command}` on {datetime.date.today().isoformat()} at {revision()} (seed {seed}, "
        f"{elapsed / 60:.0f} min, the targets' series side by side): {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, pyspark {pyspark.__version__}, regional {regional.__version__}.",
        "",
        "Each row is one query, SIGKILLed (driver, JVM and Python workers: the whole process group) at random "
        "moments, restarted on the same checkpoint each time with more input, then run to the end. 6 regions, "
        "30 new records per region before each trial, `maxRecordsPerRegion=10`, 10% of (epoch, region) pairs "
        f"fail in the target (they fall back and catch up). Most kills fall up to {EPOCH_WINDOW_S:.0f} s after "
        "the run recorded its first epoch (a driver takes 25-35 s to get there, later epochs about a second), "
        f"a share of {START_SHARE:.0%} up to {START_WINDOW_S:.0f} s after the process started (start-up, "
        f"recovery and the first epoch). A share of {PHASE_TWO_SHARE:.0%} of the trials is aimed inside phase "
        "two instead: the driver stops at a step of one of the next epochs (before the targets publish, or "
        "after they published and before the epoch's record) and is killed there. After every kill the "
        "checker compares the target with the input "
        "record by record (nothing lost before the last landed record of a region, nothing twice, nothing out "
        "of order, no wrong value); after the last run, everything must have landed.",
        "",
        "| target | source | trials | kills | aimed at phase two | kills inside phase two | epochs | records "
        "| lost | duplicated | out of order | wrong | minutes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in series:
        totals = s.totals()
        epochs = s.trials[-1].epochs_after if s.trials else 0
        records = s.final.expected if s.final else 0
        lines.append(f"| {s.target} | {s.source} | {len(s.trials)} | {s.kills} | "
                     f"{sum(t.aimed_at is not None for t in s.trials)} | "
                     f"{sum(t.intent_pending for t in s.trials)} | {epochs} | {records} | {totals['lost']} | "
                     f"{totals['duplicated']} | {totals['out_of_order']} | {totals['wrong']} | {s.seconds / 60:.1f} |")
    lines += ["", "Epochs: recorded before the last run. Kills inside phase two: the kill left an intent (the "
              "epoch's decision) without its record; the restart finished the epoch as decided. A kill can be inside "
              "phase two without being aimed there: one that falls while a restart has not yet finished the "
              "epoch an earlier kill left.", end]
    return "\n".join(lines)


def soak(args: argparse.Namespace, command: str, work: Path) -> bool:
    from regional.testing.kafka_broker import KafkaBroker
    from reliability.soak import SoakPlan, plot, run_soak, section

    plan = SoakPlan(seed=args.seed if args.seed is not None else random.randrange(1 << 30), epochs=args.soak_epochs,
                    minutes=args.soak_minutes, target=args.soak_target)
    if args.soak_no_kills:
        plan = dataclasses.replace(plan, kill_after_s=None)
    broker = KafkaBroker(work / "soak-kafka").start()
    try:
        result = run_soak(plan, work / "soak", broker, say=lambda line: print(time.strftime("%H:%M:%S"), line,
                                                                                 flush=True))
    finally:
        broker.stop()
    name = "soak-no-kills" if args.soak_no_kills else "soak"
    if plan.target != "delta":
        name += f"-{plan.target}"
    image = f"docs/{name}.png"
    plot(result, args.report.parent / image)  # beside the report it belongs to
    begin, end = markers(name)
    title = "## A soak without kills" if args.soak_no_kills else "## A soak"
    lines = [begin, title + (f" into target={plan.target}" if plan.target != "delta" else ""), "",
             f"Run on {datetime.date.today().isoformat()} at {revision()}: {os.cpu_count()} cores, "
             f"Python {platform.python_version()}.", "", *section(result, command, image), end]
    write_section(args.report, name, "\n".join(lines))
    return result.ok


def checks(report: Path, command: str, work: Path) -> bool:
    junit = work / "checks.xml"
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                             *CHECKS], cwd=ROOT, env={**os.environ, "REGIONAL_CAMPAIGN": "1"})
    begin, end = markers("checks")
    modules = ", ".join(f"`{c.split('::')[0]}`" for c in CHECKS)
    lines = [begin, "## The campaign's tests", "",
             f"Written by `{command}` on {datetime.date.today().isoformat()} at {revision()} "
             f"({(time.monotonic() - started) / 60:.0f} "
             f"min): `REGIONAL_CAMPAIGN=1 pytest` on {modules} "
             "(some of them only their crash tests).", "",
             "| test | outcome | seconds |", "|---|---|---|"]
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else \
            "skipped" if case.find("skipped") is not None else "passed"
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        lines.append(f"| `{name}` | {outcome} | {float(case.get('time', 0)):.0f} |")
    lines.append(end)
    write_section(report, "checks", "\n".join(lines))
    return result.returncode == 0


if __name__ == "__main__":
    main()
