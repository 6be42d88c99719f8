"""The soak: one regional query on a 64-partition Kafka topic for 1,000 epochs (or ``minutes``) under random faults,
its resources sampled all along, then every record checked.

Faults, all real:

- **failing targets**: ``reliability.faults.Flaky`` makes the Delta target's ``prepare`` raise for a share of
  (epoch, region) pairs: those regions fall back and catch up;
- **poison records**: a Python UDF raises on values starting ``poison``; regional isolates each into the
  dead-letter table (``deadLetterPath``) while the rest of its region goes on;
- **slow regions**: the same UDF sleeps on values starting ``slow``, holding its region's task (and the epoch)
  back;
- **outages on timers**: the same UDF calls a "service" that a timer thread takes down and brings back on the
  wall clock, knowing nothing of epochs: for every partition, or for a few drawn at random, for 5 s to a few
  minutes. Every record fails while its service is down; none of them is poison, so none may be dead-lettered;
- **kills**: the driver's process group (driver, JVM) is SIGKILLed at random moments and restarted on the same
  checkpoint.

A producer thread writes bursts of records to partitions drawn at random, each second of the soak. Every
``sample_s`` the soak records the newest epoch, the regional store's size and file count, Spark's checkpoint
size, the driver's and its JVM's RSS and open files, and the number of pyspark Python processes on the machine.
At the end the producer stops, the driver publishes what is left and stops, and ``regional.testing.exactly_once``
compares the target with the topic (every record not poison exactly once, in order per region) and the
dead-letter table with the poison records.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regional.store import Store
from regional.testing.exactly_once import Report, check, delta_landed, kafka_landed
from regional.testing.processes import descendants, open_files, process_table, rss_mb
from reliability.child import Query

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class SoakPlan:
    seed: int
    regions: int = 64
    epochs: int = 1000  # run until the store has recorded this many
    # ... or for this long, whichever comes first. Under outages and kills an epoch holds every region with input
    # since the last (a backlog after a restart, regions coming back): epochs grow to 10-20 s, and 1,000 of them
    # take hours.
    minutes: float | None = None
    # Each second the producer writes a burst to a few partitions drawn at random: every region gets input
    # over time, and an epoch has tasks for the regions with new input, a few (about 1-2 s per epoch on 2
    # cores). With input in all 64 partitions at once an epoch takes 6-12 s: 1,000 of them would take hours.
    active_regions: int = 2
    records_per_burst: int = 5
    poison_share: float = 1 / 500
    slow_share: float = 1 / 500
    slow_s: float = 2.0
    fail_share: float = 0.03  # of (epoch, region) pairs, in the target
    kill_after_s: tuple[float, float] | None = (120.0, 300.0)  # a run is killed this long after it started
    # An outage starts this long after the previous one ended, lasts this long, and is of every partition with
    # this chance (else of 1 to outage_some partitions drawn at random). The longest can outlast the shipped
    # dead-letter retries (4 failures, backed off from 1 min): then only the evidence rule keeps its records out.
    outage_gap_s: tuple[float, float] | None = (120.0, 300.0)
    outage_s: tuple[float, float] = (5.0, 300.0)
    outage_all_share: float = 0.4
    outage_some: int = 8
    sample_s: float = 5.0
    max_per_region: int = 20
    master: str = "local[2,3]"
    target: str = "delta"  # or kafka: target=kafka into a topic of as many partitions, read back read_committed


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the soak started
    epoch: int  # the newest recorded epoch, -1 before the first
    run: int  # which driver run (0, then one more after each kill)
    store_bytes: int  # <checkpoint>/regional
    store_files: int
    spark_bytes: int  # the rest of the checkpoint: Spark's offsets, commits, sources
    driver_rss_mb: float  # the Python driver process
    jvm_rss_mb: float
    driver_fds: int
    jvm_fds: int
    python_processes: int  # pyspark's daemons, workers and data source runners, on the whole machine


@dataclass
class SoakResult:
    plan: SoakPlan
    samples: list[Sample] = field(default_factory=list)
    kills: list[tuple[float, int]] = field(default_factory=list)  # (t, newest epoch) of each kill
    outages: list[Outage] = field(default_factory=list)
    produced: Counter[str] = field(default_factory=Counter)  # records by kind: normal, poison, slow
    fallbacks: Counter[str] = field(default_factory=Counter)  # (epoch, region) fall-backs by reason
    target: Report | None = None
    dead_letters: Report | None = None
    seconds: float = 0.0

    @property
    def epochs(self) -> int:
        return max((s.epoch for s in self.samples), default=-1) + 1

    @property
    def running(self) -> list[Sample]:
        """The samples from the first recorded epoch on, taken while a driver's JVM was up."""
        return [s for s in self.samples if s.epoch >= 0 and s.jvm_rss_mb > 0]

    @property
    def ok(self) -> bool:
        return bool(self.target and self.target.ok and self.dead_letters and self.dead_letters.ok)


@dataclass(frozen=True)
class Outage:
    start: float  # seconds since the soak started
    end: float
    partitions: tuple[int, ...] | None  # None: every partition


class Outages:
    """Takes the service down and brings it back on wall-clock timers (``SoakPlan.outage_*``), by creating and
    removing the flag files the query's UDF looks for (``reliability.child``). Each outage is appended to
    ``into`` when it ends."""

    def __init__(self, flags: Path, plan: SoakPlan, started: float, into: list[Outage]) -> None:
        self.flags, self.plan, self.started, self.into = flags, plan, started, into
        self.rng = random.Random(plan.seed + 2)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="soak-outages", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> Outages:
        self.flags.mkdir(parents=True, exist_ok=True)
        if self.plan.outage_gap_s:
            self.thread.start()
        return self

    def stop(self) -> None:
        """Ends the outage under way, if any: the service is up for the rest of the soak."""
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()
        if self.error is not None:
            raise RuntimeError("the soak's outage timer failed") from self.error

    def _run(self) -> None:
        try:
            self._outages()
        except BaseException as e:  # reported by stop()
            self.error = e

    def _outages(self) -> None:
        assert self.plan.outage_gap_s
        while not self.done.wait(self.rng.uniform(*self.plan.outage_gap_s)):
            partitions = (None if self.rng.random() < self.plan.outage_all_share else
                          tuple(sorted(self.rng.sample(range(self.plan.regions),
                                                       self.rng.randint(1, self.plan.outage_some)))))
            names = ["all"] if partitions is None else [f"p{p}" for p in partitions]
            start = time.monotonic() - self.started
            for name in names:
                (self.flags / name).touch()
            self.done.wait(self.rng.uniform(*self.plan.outage_s))
            for name in names:
                (self.flags / name).unlink()
            self.into.append(Outage(start, time.monotonic() - self.started, partitions))


class Producer:
    """Each second until stopped, writes ``records_per_burst`` records to each of ``active_regions`` partitions
    drawn at random; values are ``<kind>-<partition>-<n>`` with kind ``poison``, ``slow`` or ``v``, drawn from
    the plan's shares."""

    def __init__(self, broker: Any, topic: str, plan: SoakPlan, produced: Counter[str]) -> None:
        self.broker, self.topic, self.plan, self.produced = broker, topic, plan, produced
        self.rng = random.Random(plan.seed)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="soak-producer", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> Producer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        if self.error is not None:
            raise RuntimeError("the soak's producer failed") from self.error

    def _run(self) -> None:
        try:
            producer = self.broker.producer()
            n = 0
            while not self.done.wait(1.0):
                for p in self.rng.sample(range(self.plan.regions), self.plan.active_regions):
                    for _ in range(self.plan.records_per_burst):
                        draw = self.rng.random()
                        kind = ("poison" if draw < self.plan.poison_share else
                                "slow" if draw < self.plan.poison_share + self.plan.slow_share else "v")
                        producer.produce(self.topic, value=f"{kind}-{p}-{n}".encode(), partition=p)
                        self.produced[kind] += 1
                        n += 1
                producer.poll(0)
            if producer.flush(60) != 0:
                raise RuntimeError("records left unsent")
        except BaseException as e:  # reported by stop()
            self.error = e


def run_soak(plan: SoakPlan, workdir: Path, broker: Any, say: Callable[[str], None] = print) -> SoakResult:
    workdir.mkdir(parents=True, exist_ok=True)
    topic = f"soak.{plan.seed}"
    broker.create_topic(topic, plan.regions)
    until = workdir / "finish"
    out = str(workdir / "out")
    if plan.target == "kafka":
        out = f"soak-out.{plan.seed}"
        broker.create_topic(out, plan.regions)
    query = Query(source="kafka", target=plan.target, checkpoint=str(workdir / "ck"), input=topic,
                  out=out, bootstrap=broker.bootstrap, fail_share=plan.fail_share,
                  max_per_region=plan.max_per_region, master=plan.master, udf_faults=True, slow_s=plan.slow_s,
                  dead_letters=str(workdir / "dead"), until=str(until), outages=str(workdir / "service-down"))
    result = SoakResult(plan)
    rng = random.Random(plan.seed + 1)
    store = Store(query.checkpoint)
    started = time.monotonic()
    producer = Producer(broker, topic, plan, result.produced).start()
    outages = Outages(Path(query.outages), plan, started, result.outages).start()
    run = 0
    child = _start(query, workdir, run)
    kill_at = _kill_at(plan, rng)
    try:
        while True:
            time.sleep(plan.sample_s)
            sample = _sample(time.monotonic() - started, store, query.checkpoint, child.pid, run)
            result.samples.append(sample)
            if child.poll() is not None:
                raise AssertionError(f"the driver ended on its own: see {workdir}/run-{run}.log")
            if sample.epoch + 1 >= plan.epochs or (plan.minutes is not None and sample.t >= plan.minutes * 60):
                break
            if time.monotonic() >= kill_at:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                result.kills.append((sample.t, sample.epoch))
                say(f"soak: killed run {run} at epoch {sample.epoch}, {sample.t / 60:.1f} min")
                run += 1
                child = _start(query, workdir, run)
                kill_at = _kill_at(plan, rng)
            elif len(result.samples) % 12 == 0:
                say(f"soak: epoch {sample.epoch}, {sample.t / 60:.1f} min, store {sample.store_bytes // 1024} KB "
                    f"in {sample.store_files} files, JVM {sample.jvm_rss_mb:.0f} MB, driver "
                    f"{sample.driver_rss_mb:.0f} MB, fds {sample.jvm_fds}+{sample.driver_fds}, "
                    f"python processes {sample.python_processes}")
        producer.stop()
        outages.stop()  # the service is up again: the last run must publish every record that is not poison
        until.touch()  # the driver publishes what is left, then stops
        deadline = time.monotonic() + 1800
        while child.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError("the driver did not finish the input within 30 minutes")
            time.sleep(plan.sample_s)
            result.samples.append(_sample(time.monotonic() - started, store, query.checkpoint, child.pid, run))
        if child.returncode != 0:
            raise AssertionError(f"the last run failed: see {workdir}/run-{run}.log")
    finally:
        producer.done.set()
        outages.done.set()
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    result.seconds = time.monotonic() - started
    say(f"soak: {result.epochs} epochs in {result.seconds / 60:.0f} min, {len(result.kills)} kills, "
        f"{len(result.outages)} outages; checking")
    records = broker.records(topic)
    poison = {r: [(o, v) for o, v in rs if v is not None and v.startswith(b"poison")] for r, rs in records.items()}
    rest = {r: [(o, v.decode().upper()) for o, v in rs if v is not None and not v.startswith(b"poison")]
            for r, rs in records.items()}
    landed = kafka_landed(broker.bootstrap, query.out) if plan.target == "kafka" else delta_landed(query.out)
    result.target = check(rest, landed)
    dead = Path(query.dead_letters)
    result.dead_letters = check(poison, delta_landed(dead) if (dead / "_delta_log").exists() else [])
    result.fallbacks = fallbacks(Path(query.out)) if plan.target == "delta" else store_fallbacks(store)
    say(f"soak: target {result.target.summary()}; dead letters {result.dead_letters.summary()}")
    return result


def _kill_at(plan: SoakPlan, rng: random.Random) -> float:
    return time.monotonic() + rng.uniform(*plan.kill_after_s) if plan.kill_after_s else float("inf")


def _start(query: Query, workdir: Path, run: int) -> subprocess.Popen[bytes]:
    with open(workdir / f"run-{run}.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", *query.args()], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def fallbacks(table: Path) -> Counter[str]:
    """(epoch, region) fall-backs by reason, from the regional report in each Delta commit's info."""
    reasons: Counter[str] = Counter()
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            info = json.loads(line).get("commitInfo") if line.strip() else None
            report = info.get("regional") if info else None
            if isinstance(report, str):
                report = json.loads(report)
            for state in (report or {}).get("fallen_back", {}).values():
                reasons[state["reason"].split(":")[0].split(";")[0]] += 1
    return reasons


# -- sampling ------------------------------------------------------------------------------------------------


def store_fallbacks(store: Store) -> Counter[str]:
    """(epoch, region) fall-backs by reason, from the epoch records the store keeps (``retainEpochs``): a target
    without a commit history of its own (Kafka)."""
    from regional.targets.base import reason_class

    counts: Counter[str] = Counter()
    for epoch in store.epochs():
        record = store.read_record(epoch)
        for fell in (record.fallen_back.values() if record is not None else []):
            counts[reason_class(fell.reason)] += 1
    return counts


def _sample(t: float, store: Store, checkpoint: str, driver: int, run: int) -> Sample:
    epochs = store.epochs()
    regional_bytes, regional_files, spark_bytes = _sizes(Path(checkpoint))
    table = process_table()
    jvm = next((p.pid for p in descendants(table, driver) if p.name == "java"), None)
    return Sample(t=t, epoch=max(epochs, default=-1), run=run, store_bytes=regional_bytes,
                  store_files=regional_files, spark_bytes=spark_bytes, driver_rss_mb=rss_mb(driver),
                  jvm_rss_mb=rss_mb(jvm), driver_fds=open_files(driver), jvm_fds=open_files(jvm),
                  python_processes=sum("pyspark" in p.cmdline and "python" in p.cmdline for p in table.values()))


def _sizes(checkpoint: Path) -> tuple[int, int, int]:
    """Bytes and files of the regional store, and bytes of the rest of the checkpoint, in one walk."""
    store_bytes = store_files = other_bytes = 0
    store = os.path.join(checkpoint, "regional")
    for root, _, names in os.walk(checkpoint):
        in_store = root == store or root.startswith(store + os.sep)
        for name in names:
            try:
                size = os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:  # removed while walked (pruning)
                continue
            if in_store:
                store_bytes, store_files = store_bytes + size, store_files + 1
            else:
                other_bytes += size
    return store_bytes, store_files, other_bytes


# -- the report ----------------------------------------------------------------------------------------------

METRICS = [  # (title, Sample fields, unit divisor)
    ("regional store (KB)", ("store_bytes",), 1024),
    ("regional store (files)", ("store_files",), 1),
    ("Spark's checkpoint (KB)", ("spark_bytes",), 1024),
    ("RSS (MB): JVM, Python driver", ("jvm_rss_mb", "driver_rss_mb"), 1),
    ("open files: JVM, Python driver", ("jvm_fds", "driver_fds"), 1),
    ("pyspark Python processes", ("python_processes",), 1),
]


def plot(result: SoakResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result.running
    minutes = [s.t / 60 for s in samples]
    fig, axes = plt.subplots(len(METRICS) + 1, 1, figsize=(9, 2.0 * (len(METRICS) + 1)), sharex=True)
    axes[0].plot(minutes, [s.epoch for s in samples], color="black")
    axes[0].set_title("newest recorded epoch (red: driver SIGKILLed; grey: service down for every partition, "
                      "orange: for some)", fontsize=9, loc="left")
    for ax, (title, names, unit) in zip(axes[1:], METRICS, strict=True):
        for name in names:
            ax.plot(minutes, [getattr(s, name) / unit for s in samples], label=name)
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_ylim(bottom=0)
    for ax in axes:
        for t, _ in result.kills:
            ax.axvline(t / 60, color="red", linewidth=0.6, linestyle=":")
        for outage in result.outages:
            ax.axvspan(outage.start / 60, outage.end / 60, color="orange" if outage.partitions else "grey",
                       alpha=0.2, linewidth=0)
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def section(result: SoakResult, command: str, image: str) -> list[str]:
    """The soak's part of RELIABILITY.md, without markers."""
    plan, samples = result.plan, result.running
    kills = (f"the driver's process group is SIGKILLed {plan.kill_after_s[0] / 60:.0f}-"
             f"{plan.kill_after_s[1] / 60:.0f} min after each start and restarted" if plan.kill_after_s else
             "no kills: one driver runs the whole soak")
    reasons = ", ".join(f"{n} {r}" for r, n in result.fallbacks.most_common()) or "none"
    outages = (f"the service the UDF calls goes down on a wall-clock timer {plan.outage_gap_s[0]:.0f}-"
               f"{plan.outage_gap_s[1]:.0f} s after the soak starts or it came back, for {plan.outage_s[0]:.0f}-"
               f"{plan.outage_s[1]:.0f} s, for every partition (a {plan.outage_all_share:.0%} chance) or for "
               f"1-{plan.outage_some} partitions drawn at random, whatever the epochs are doing" if plan.outage_gap_s
               else "no outages")
    every = [o for o in result.outages if o.partitions is None]
    some = [o for o in result.outages if o.partitions is not None]
    longest = max((o.end - o.start for o in result.outages), default=0.0)
    into = "a Kafka topic (target=kafka, read back read_committed)" if plan.target == "kafka" else "Delta"
    lines = [
        f"Written by `{command}` (seed {plan.seed}, {result.seconds / 60:.0f} min). One query: a Kafka topic of "
        f"{plan.regions} partitions (regions) into {into}, `deadLetterPath` set, `maxRecordsPerRegion="
        f"{plan.max_per_region}`, on `{plan.master}`. Each second of the soak a producer writes "
        f"{plan.records_per_burst} records to each of {plan.active_regions} partitions drawn at random (so an "
        "epoch has tasks for the regions with new input, and every region gets input over time). "
        f"Faults: {plan.fail_share:.0%} of (epoch, region) "
        f"pairs fail in the target; a Python UDF raises on 1 record in {1 / plan.poison_share:.0f} (poison) "
        f"and sleeps {plan.slow_s:g} s on 1 in {1 / plan.slow_share:.0f} (slow regions); {outages}; {kills}. "
        f"Resources sampled every {plan.sample_s:g} s; at the end the producer stops and the last run publishes "
        "what is left.",
        "",
        "| epochs | minutes | kills | outages: every partition / some (longest) | records | poison | slow "
        "| fall-backs (epoch, region) by reason "
        "| target: every other record once, in order | dead-letter table: every poison record once |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {result.epochs} | {result.seconds / 60:.0f} | {len(result.kills)} | {len(every)} / {len(some)} "
        f"({longest:.0f} s) | {sum(result.produced.values())} | "
        f"{result.produced['poison']} | {result.produced['slow']} | {reasons} | "
        f"{result.target.summary() if result.target else 'not checked'} | "
        f"{result.dead_letters.summary() if result.dead_letters else 'not checked'} |",
        "",
        "Resources, the largest value in each tenth of the soak (by time):",
        "",
        "| tenth | epochs | store KB | store files | Spark's checkpoint KB | JVM RSS MB | driver RSS MB | "
        "JVM open files | driver open files | pyspark Python processes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i in range(10):
        part = samples[len(samples) * i // 10: len(samples) * (i + 1) // 10]
        if not part:
            continue
        top = {name: max(getattr(s, name) for s in part) for _, names, _ in METRICS for name in names}
        lines.append(f"| {i + 1} | {part[0].epoch}-{part[-1].epoch} | {top['store_bytes'] // 1024} | "
                     f"{top['store_files']} | {top['spark_bytes'] // 1024} | {top['jvm_rss_mb']:.0f} | "
                     f"{top['driver_rss_mb']:.0f} | {top['jvm_fds']} | {top['driver_fds']} | "
                     f"{top['python_processes']} |")
    half = len(samples) // 2
    growth = []
    for _, names, unit in METRICS:
        for name in names:
            first = max((getattr(s, name) for s in samples[:half]), default=0) / unit
            second = max((getattr(s, name) for s in samples[half:]), default=0) / unit
            growth.append(f"{name} {first:.0f} -> {second:.0f}")
    lines += ["", "Largest value in the first half -> in the second half: " + "; ".join(growth) + ".", "",
              f"![the soak's resources over time]({image})"]
    return lines
