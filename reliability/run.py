"""The reliability campaign, one command; writes RELIABILITY.md (or ``--report``) from the run.

    .venv/bin/python -m reliability.run                    # 50 random-kill trials per target
    .venv/bin/python -m reliability.run --trials 4         # a short run

Each target (delta, the python committer ``regional.testing.committer.EpochFilesTarget``, postgres) gets
``--trials`` trials, half reading the files source and half a Kafka topic (``reliability.random_kills``). It
starts its own Kafka broker and PostgreSQL server on loopback addresses and stops them at the end.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
os.environ["PYSPARK_PYTHON"] = sys.executable  # Python workers run this interpreter

from reliability.random_kills import Series, run_series  # noqa: E402

TARGETS = ("delta", "python", "postgres")
SOURCES = ("files", "kafka")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=50, help="random-kill trials per target (split across sources)")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--parallel", type=int, default=3, help="targets run at once")
    parser.add_argument("--report", type=Path, default=ROOT / "RELIABILITY.md")
    parser.add_argument("--work", type=Path, default=None, help="work directory (default: a temporary one)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    targets = [t for t in args.targets.split(",") if t]
    work = args.work or Path(tempfile.mkdtemp(prefix="regional-reliability-"))
    started = time.monotonic()
    log = work / "campaign.log"

    lock = threading.Lock()

    def say(line: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {line}"
        with lock:
            print(line, flush=True)
            with open(log, "a") as f:
                f.write(line + "\n")

    from regional.testing.kafka_broker import KafkaBroker
    from regional.testing.postgres_server import PostgresServer

    broker = KafkaBroker(work / "kafka").start()
    postgres = PostgresServer().start() if "postgres" in targets else None

    def one_target(t: int, target: str) -> list[Series]:
        done = []
        for s, source in enumerate(SOURCES):
            trials = args.trials // len(SOURCES) + (s < args.trials % len(SOURCES))
            done.append(run_series(target, source, trials, seed + 10 * t + s, work / f"{target}-{source}",
                                   broker=broker, postgres=postgres, say=say))
        return done

    series: list[Series] = []
    try:
        # The targets in parallel: a trial is mostly a driver starting (processes spawned one after another),
        # so two or three at once use the cores better than one.
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            for done in pool.map(one_target, range(len(targets)), targets):
                series.extend(done)
    finally:
        broker.stop()
        if postgres is not None:
            postgres.remove()
    command = "python -m reliability.run " + " ".join(sys.argv[1:])
    write_report(args.report, series, command.strip(), seed, time.monotonic() - started)
    say(f"wrote {args.report}")
    if all(s.ok for s in series):
        shutil.rmtree(work, ignore_errors=True)
    else:
        say(f"FAILED: work directory kept in {work}")
        sys.exit(1)


def write_report(path: Path, series: list[Series], command: str, seed: int, elapsed: float) -> None:
    import pyspark

    import regional

    lines = [
        "# Reliability",
        "",
        f"Written by `{command}` on {datetime.date.today().isoformat()} (seed {seed}, {elapsed / 60:.0f} min, "
        "the targets' series running side by side): "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, pyspark {pyspark.__version__}, "
        f"regional {regional.__version__}.",
        "",
        "## Random kills of the driver",
        "",
        "Each row is one query, SIGKILLed (driver, JVM and Python workers: the whole process group) at random "
        "moments, restarted on the same checkpoint each time with more input, then run to the end. 6 regions, "
        "30 new records per region before each trial, `maxRecordsPerRegion=10`, 10% of (epoch, region) pairs "
        "fail in the target (they fall back and catch up). Most kills fall up to 3 s after the run recorded "
        "its first epoch (a driver takes 25-35 s to get there, later epochs about a second), one in five up to "
        "35 s after the process started (start-up, recovery and the first epoch). After every "
        "kill the checker (`regional.testing.exactly_once`) compares the target with the input record by "
        "record (nothing lost before the last landed record of a region, nothing twice, nothing out of order); "
        "after the last run, everything must have landed.",
        "",
        "| target | source | trials | kills | kills inside phase two | epochs | records | lost | duplicated "
        "| out of order | wrong | minutes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in series:
        totals = s.totals()
        epochs = s.trials[-1].epochs_after if s.trials else 0
        records = s.final.expected if s.final else 0
        lines.append(f"| {s.target} | {s.source} | {len(s.trials)} | {s.kills} | "
                     f"{sum(t.intent_pending for t in s.trials)} | {epochs} | {records} | {totals['lost']} | "
                     f"{totals['duplicated']} | {totals['out_of_order']} | {totals['wrong']} | {s.seconds / 60:.1f} |")
    lines += ["", "Kills inside phase two: the kill left an intent (the epoch's decision) without its record; "
              "the restart finished the epoch as decided.", ""]
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
