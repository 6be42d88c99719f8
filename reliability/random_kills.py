"""Random kills of the driver: one query per (target, source), SIGKILLed at random moments, checked after
every kill and at the end.

A series: add input, start the driver, SIGKILL its whole process tree (driver, JVM, Python workers) after a
random delay, check what landed so far (nothing lost before the last landed record, nothing duplicated,
nothing out of order), and again; at the end one run without a kill, then everything must have landed exactly
once, in order per region. Some (epoch, region) pairs fail in the target (``reliability.faults.Flaky``), so
regions fall back and catch up while the kills land.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from regional.store import Store
from regional.testing.exactly_once import (
    Landed,
    Report,
    check,
    delta_landed,
    epoch_files_landed,
    kafka_landed,
    postgres_landed,
)
from regional.testing.killable import run_killable
from reliability.child import Query

ROOT = Path(__file__).resolve().parent.parent
REGIONS = 6
RECORDS_PER_TRIAL = 30  # per region: three epochs of work at maxRecordsPerRegion=10
START_SHARE = 0.2
START_WINDOW_S = 35.0
EPOCH_WINDOW_S = 3.0
# A share of the kills aimed inside phase two: a random kill almost never lands there (phase two takes
# milliseconds of an epoch), so these stop the driver at one of its steps (regional.failpoints) in one of the
# next epochs, and kill it there.
PHASE_TWO_SHARE = 0.3
PHASE_TWO_STEPS = ("before_publish", "before_record")  # the series have no dead letters: the steps between
# target=kafka's own steps inside its transaction: produced (not committed), committed (the epoch not recorded yet)
KAFKA_STEPS = ("kafka_produced", "kafka_committed")


@dataclass
class Trial:
    number: int
    outcome: str  # killed | finished
    in_start: bool  # the kill was timed from the process start, not from the run's first epoch
    aimed_at: str | None  # a phase-two step "<step>:<epoch>" the kill was aimed at, or None (a timed kill)
    kill_after_s: float
    epochs_before: int
    epochs_after: int
    intent_pending: bool  # killed between an epoch's decision and its record
    report: Report


@dataclass
class Series:
    target: str
    source: str
    seed: int
    trials: list[Trial] = field(default_factory=list)
    final: Report | None = None
    seconds: float = 0.0

    @property
    def kills(self) -> int:
        return sum(t.outcome == "killed" for t in self.trials)

    def totals(self) -> dict[str, int]:
        reports = [t.report for t in self.trials] + ([self.final] if self.final else [])
        return {k: sum(len(getattr(r, k)) for r in reports) for k in ("lost", "duplicated", "out_of_order", "wrong")}

    @property
    def ok(self) -> bool:
        return self.final is not None and self.final.ok and all(t.report.ok for t in self.trials)


class Feed(Protocol):
    def add(self, tag: str, per_region: int) -> None: ...

    def expected(self) -> dict[str, list[tuple[int, Any]]]: ...


class FilesFeed:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.records: dict[str, list[tuple[int, str]]] = {f"r{i}": [] for i in range(REGIONS)}

    def add(self, tag: str, per_region: int) -> None:
        from integration.helpers import add_epoch_of_files  # hidden names, then renames

        for region, values in add_epoch_of_files(self.root, list(self.records), tag, per_region).items():
            first = len(self.records[region])
            self.records[region].extend((first + i, v.upper()) for i, v in enumerate(values))

    def expected(self) -> dict[str, list[tuple[int, Any]]]:
        return self.records


class ObjectFilesFeed(FilesFeed):
    """The same files, on an object store: each one PUT (an object appears whole, no hidden name needed)."""

    def __init__(self, location: str) -> None:
        from regional.location import parse_location
        from regional.storage import open_storage

        super().__init__(Path())
        self.storage = open_storage(parse_location("in", location))

    def add(self, tag: str, per_region: int) -> None:
        for region, records in self.records.items():
            first = len(records)
            values = [f"{region}-{tag}-{i}" for i in range(per_region)]
            self.storage.write(f"{region}/{tag}.txt", "".join(v + "\n" for v in values).encode())
            records.extend((first + i, v.upper()) for i, v in enumerate(values))


class KafkaFeed:
    def __init__(self, broker: Any, topic: str) -> None:
        self.broker, self.topic = broker, topic
        broker.create_topic(topic, REGIONS)

    def add(self, tag: str, per_region: int) -> None:
        producer = self.broker.producer()
        for i in range(per_region):
            for p in range(REGIONS):
                producer.produce(self.topic, value=f"{tag}-{p}-{i}".encode(), partition=p)
        assert producer.flush(60) == 0

    def expected(self) -> dict[str, list[tuple[int, Any]]]:
        return {r: [(o, v.decode().upper()) for o, v in records]
                for r, records in self.broker.records(self.topic).items()}


def run_series(target: str, source: str, trials: int, seed: int, workdir: Path, broker: Any = None,
               postgres: Any = None, fail_share: float = 0.1, say: Callable[[str], None] = print,
               s3: Any = None) -> Series:
    """``trials`` runs of one query, each killed at a random moment (a run that finishes first is a trial
    without a kill), then one run to the end. A driver takes 25-35 s to record its first epoch (Spark starts a
    Python process for each step of a Python data source, one after the other; later epochs take about a
    second): most kills are timed from the run's first recorded epoch (up to ``EPOCH_WINDOW_S`` later), one in
    ``START_SHARE`` from the process start (start-up, recovery and the first epoch). With ``s3`` (an
    ``S3Server``), ``target`` is ``delta-s3``: the checkpoint, the Delta table and the input files are on that
    server."""
    rng = random.Random(seed)
    name = f"{target}_{source}_{seed}"
    workdir.mkdir(parents=True, exist_ok=True)
    feed: Feed = FilesFeed(workdir / "in") if source == "files" else KafkaFeed(broker, f"kills.{name}")
    checkpoint, out, files_in = str(workdir / "ck"), str(workdir / "out"), str(workdir / "in")
    if s3 is not None:
        bucket = s3.create_bucket(f"kills-{source}-{seed}")
        checkpoint, out, files_in = f"{bucket}/ck", f"{bucket}/out", f"{bucket}/in"
        if source == "files":
            feed = ObjectFilesFeed(files_in)
    query = Query(source=source, target=target.removesuffix("-s3"), checkpoint=checkpoint,
                  input=files_in if source == "files" else f"kills.{name}",
                  out=out, bootstrap=broker.bootstrap if broker else "",
                  url=postgres.url if postgres else "", table=f"kills_{name}", fail_share=fail_share,
                  s3_endpoint=s3.endpoint if s3 is not None else "")
    if target in ("kafka", "stock-kafka"):
        query = replace(query, out=f"kills-out.{name}")
        broker.create_topic(query.out, REGIONS)
    if target == "stock-kafka":  # many small micro-batches, so that kills fall inside Spark's batches
        query = replace(query, max_per_region=1)
    if target == "postgres":
        with postgres.connect() as conn:  # no primary key: a row written twice must show, not be refused
            conn.execute(f'CREATE TABLE {query.table} (region text, "offset" bigint, value text)')
    landed = _reader(query, postgres)
    store = Store(query.checkpoint)
    series = Series(target, source, seed)
    started = time.monotonic()
    marker = workdir / "unused-marker"
    for number in range(trials):
        feed.add(f"{number:04d}", RECORDS_PER_TRIAL)
        before = len(store.epochs())
        aimed = None
        if rng.random() < PHASE_TWO_SHARE and target != "stock-kafka":  # Spark's sink has no steps to aim at
            steps = PHASE_TWO_STEPS + (KAFKA_STEPS if target == "kafka" else ())
            aimed = f"{rng.choice(steps)}:{max(store.epochs(), default=-1) + 1 + rng.randint(0, 2)}"
        in_start = aimed is None and rng.random() < START_SHARE and target != "stock-kafka"
        delay = rng.uniform(0, START_WINDOW_S if in_start else EPOCH_WINDOW_S)
        armed = None if in_start else (lambda: len(store.epochs()) > before)  # noqa: B023 (used at once)
        if target == "stock-kafka":  # no store: timed from its first new output, then about a micro-batch a second
            landed_before = len(landed())
            delay, armed = rng.uniform(0, 2 * EPOCH_WINDOW_S), (lambda: len(landed()) > landed_before)  # noqa: B023
        outcome = run_killable(query.args(), aimed, marker, timeout=600, kill_after=None if aimed else delay,
                               cwd=ROOT, armed=armed)
        epochs = store.epochs()
        pending = bool(store.read_intent(max(epochs, default=-1) + 1)) if outcome == "killed" else False
        report = check(feed.expected(), landed(), complete=False)
        series.trials.append(Trial(number, outcome, in_start, aimed, delay, before, len(epochs), pending, report))
        moment = (f"aimed at {aimed}" if aimed else "from the start" if in_start
                  else "after the run's first recorded epoch")
        say(f"{name} trial {number}: {outcome} {delay:.1f}s {moment}, epochs {before}->{len(epochs)}"
            f"{' (inside phase two)' if pending else ''}: {report.summary()}")
    assert run_killable(query.args(), None, marker, timeout=900, cwd=ROOT) == "finished"
    series.final = check(feed.expected(), landed())
    series.seconds = time.monotonic() - started
    say(f"{name} final: {series.final.summary()}")
    return series


def _reader(query: Query, postgres: Any) -> Callable[[], list[Landed]]:
    if query.target == "delta" and query.s3_endpoint:
        from regional.location import parse_location
        from regional.storage import open_storage

        table = open_storage(parse_location("out", query.out))
        return lambda: delta_landed(query.out) if table.list("_delta_log") else []
    if query.target == "delta":
        return lambda: delta_landed(query.out) if Path(query.out, "_delta_log").exists() else []
    if query.target == "python":
        return lambda: epoch_files_landed(query.out) if Path(query.out).exists() else []
    if query.target in ("kafka", "stock-kafka"):
        return lambda: kafka_landed(query.bootstrap, query.out)

    def read() -> list[Landed]:
        with postgres.connect() as conn:
            return postgres_landed(conn, query.table)
    return read
