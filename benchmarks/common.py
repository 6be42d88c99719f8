"""What the scenario modules of ``benchmarks.run`` share: the input, the two pipelines, timing, sampling."""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark

import regional
from regional.testing.processes import Process, descendants, process_table, rss_mb

REGIONS = [f"r{i:02d}" for i in range(16)]
# Stock Spark's Kafka source, for the pyspark line installed. Its x.y.0 release: connectors of one Spark line
# work across its patch releases, and spark-sql-kafka 4.2.1 is not on Maven Central (4.2.0 is).
KAFKA_PACKAGE = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{'.'.join(pyspark.__version__.split('.')[:2])}.0"
FAILING = "r00"


@dataclass(frozen=True)
class Mode:
    name: str
    volume_rows_per_file: int  # scenario 1's input: 16 regions of files of ~200-byte lines
    volume_files_per_region: int
    rows_per_file: int  # the fault scenarios' input (2 and 5)
    files_per_region: int
    repeats: int
    window_s: float  # scenario 2's failure window
    straggler_rows: int  # scenario 3: rows per region
    scale_regions: tuple[int, ...]  # scenario 4: the driver's work per epoch
    store_epochs: int
    known_regions: int  # scenario 4: regions known to the query, 10 of them with data per epoch


QUICK = Mode("quick", 8_000, 2, 2_000, 4, 1, 12.0, 800, (16, 1_000, 10_000), 300, 200)
# Scenario 2's window is 40 s; at ~30k healthy rows/s its 15 healthy regions need 14 files each to last it.
FULL = Mode("full", 62_500, 4, 10_000, 14, 2, 40.0, 3_000, (16, 1_000, 10_000), 1000, 1_000)
LINE_PAD = "payload-" * 22  # with the prefix, lines of about 200 bytes


@dataclass
class Row:
    scenario: str
    metric: str
    stock: str
    regional: str
    ratio: str
    goal: str
    met: str
    notes: list[str] = field(default_factory=list)


def spread(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    """min / median / max over repeats."""
    if len(values) == 1:
        return fmt.format(values[0])
    return "/".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


# -- input -------------------------------------------------------------------------------------


def write_input(root: Path, rows_per_file: int, files_per_region: int, pad: str = "payload-" * 10) -> int:
    """16 regions of text files, one sub-directory per region (the layout both sources read)."""
    # File by file across the regions, so that stock Spark's file source (which goes by modification
    # time) reads every region in every batch, as regional does.
    for f in range(files_per_region):
        for region in REGIONS:
            directory = root / region
            directory.mkdir(parents=True, exist_ok=True)
            lines = (f"{region} record {f * rows_per_file + i:08d} {pad}" for i in range(rows_per_file))
            (directory / f"{f:05d}.txt").write_text("\n".join(lines) + "\n")
    return len(REGIONS) * files_per_region * rows_per_file


def delta_rows(table: Path) -> int:
    from deltalake import DeltaTable

    try:
        return DeltaTable(str(table)).to_pyarrow_dataset().count_rows()
    except Exception:  # no table yet
        return 0


# -- the two pipelines -------------------------------------------------------------------------


def regional_query(spark, inp: Path, out: Path, ck: Path, per_epoch: int, *, available_now: bool = True,
                   target: str = "delta", transform: Callable | None = None, **options: str):
    from pyspark.sql import functions as F

    df = (spark.readStream.format("regional").option("source", "files").option("path", str(inp))
          .option("maxRecordsPerRegion", str(per_epoch)).load())
    df = df.select("region", "offset", (transform(df) if transform else F.upper("value")).alias("value"))
    writer = (df.writeStream.format("regional").option("target", target).option("path", str(out))
              .option("checkpointLocation", str(ck)))
    for k, v in options.items():
        writer = writer.option(k, v)
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def stock_query(spark, inp: Path, out: Path, ck: Path, files_per_batch: int, *, available_now: bool = True,
                transform: Callable | None = None, files: str = "*.txt"):
    from pyspark.sql import functions as F

    df = (spark.readStream.format("text").option("maxFilesPerTrigger", str(files_per_batch))
          .load(str(inp / "*" / files))
          # Every record starts with its region id. (input_file_name() is empty below a Python UDF.)
          .withColumn("region", F.substring_index("value", " ", 1)))
    df = df.select("region", (transform(df) if transform else F.upper("value")).alias("value"))
    writer = df.writeStream.format("delta").option("checkpointLocation", str(ck))
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start(str(out))


def timed(start: Callable) -> float:
    began = time.perf_counter()
    query = start()
    query.awaitTermination()
    if query.exception():
        raise RuntimeError(query.exception())
    return time.perf_counter() - began


# -- sampling ----------------------------------------------------------------------------------


class Periodic:
    """Calls ``sample`` every ``interval`` seconds on a thread until ``stop``."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # a sample that fails (a table being written, a process ending) is skipped
                pass
            self._stop.wait(self.interval)

    def _halt(self) -> None:
        self._stop.set()
        self._thread.join()


class Sampler(Periodic):
    """Samples a cumulative count every ``interval`` seconds on a thread."""

    def __init__(self, count: Callable[[], int], interval: float = 0.25) -> None:
        super().__init__(interval)
        self.count = count
        self.samples: list[tuple[float, int]] = []
        self.t0 = time.perf_counter()
        self.window = (0.0, 0.0)  # the failure window, in seconds since t0
        self._thread.start()

    def sample(self) -> None:
        self.samples.append((time.perf_counter() - self.t0, self.count()))

    def stop(self) -> list[tuple[float, int]]:
        self._halt()
        return self.samples

    def count_at(self, t: float) -> int:
        """The count sampled last at or before ``t`` (0 before the first sample)."""
        return max((n for at, n in self.samples if at <= t), default=0)

    def rate(self, start: float, end: float) -> float:
        inside = [(t, n) for t, n in self.samples if start <= t <= end]
        if len(inside) < 2:
            return 0.0
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


class EpochRecorder(Periodic):
    """Keeps every epoch record of a running query's store, read every ``interval`` seconds on a thread: the
    store keeps only the last ``retainEpochs`` (100 by default), and a long run has more."""

    def __init__(self, ck: Path, interval: float = 0.5) -> None:
        super().__init__(interval)
        self.ck = ck
        self.records: dict[int, Any] = {}  # epoch -> EpochRecord
        self._thread.start()

    def sample(self) -> None:
        from regional.store import Store

        store = Store(self.ck)
        for epoch in store.epochs():
            if epoch not in self.records and (record := store.read_record(epoch)) is not None:
                self.records[epoch] = record

    def stop(self) -> list[Any]:
        """Every record seen, in epoch order (a last read first: the final epochs)."""
        self._halt()
        self.sample()
        return [self.records[e] for e in sorted(self.records)]


def wait_until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark query made no progress")
        time.sleep(0.1)


def spark_processes(table: dict[int, Process]) -> tuple[list[int], list[int]]:
    """The pids of this driver's JVM and of the Python processes below it (Spark's Python workers)."""
    me = os.getpid()
    jvms = [p.pid for p in table.values() if p.ppid == me and p.name == "java"]
    return jvms, [p.pid for jvm in jvms for p in descendants(table, jvm) if p.name.startswith("python")]


class Footprint(Periodic):
    """Peak resident memory of the driver (this Python process and its JVM) and of the Python workers
    (processes below the JVM), sampled from /proc every ``interval`` seconds on a thread."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(interval)
        self.driver_mb = 0.0
        self.worker_mb = 0.0  # the largest single Python worker
        self.workers = 0  # the most Python workers alive at once
        self._thread.start()

    def sample(self) -> None:
        jvms, workers = spark_processes(process_table())
        driver = rss_mb(os.getpid()) + sum(rss_mb(p) for p in jvms)
        self.driver_mb = max(self.driver_mb, driver)
        self.worker_mb = max([self.worker_mb, *(rss_mb(p) for p in workers)])
        self.workers = max(self.workers, len(workers))

    def stop(self) -> Footprint:
        self._halt()
        return self

    def describe(self) -> str:
        return (f"peak RSS: driver (Python + JVM) {self.driver_mb:,.0f} MB, largest Python worker "
                f"{self.worker_mb:,.0f} MB, at most {self.workers} Python workers")


def cpu_seconds(pid: int, own: bool = True, reaped: bool = True) -> float:
    """CPU seconds (user + system) of ``pid``, and of its children it has waited for."""
    try:
        fields = [int(x) for x in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:15]]
    except OSError:
        return 0.0
    return ((fields[0] + fields[1]) * own + (fields[2] + fields[3]) * reaped) / os.sysconf("SC_CLK_TCK")


def cpu_by_process(server_pid: int | None = None) -> dict[str, float]:
    """CPU seconds so far of this driver's JVM, its Python workers (live ones, and the ended ones their parents
    waited for) and, given its main pid, a server's processes: subtract two of these around a run. A process
    that ends between the two and that no live parent has waited for is missed (a small undercount)."""
    table = process_table()
    jvms, workers = spark_processes(table)
    found = {"driver (Python)": cpu_seconds(os.getpid(), reaped=False),
             "JVM": sum(cpu_seconds(j, reaped=False) for j in jvms),
             "Python workers": sum(cpu_seconds(w) for w in workers)}
    if server_pid is not None:
        found["server"] = cpu_seconds(server_pid) + sum(cpu_seconds(c.pid, reaped=False)
                                                        for c in descendants(table, server_pid))
    return found


def cpu_per_million(runs: list[dict[str, float]], rows: int) -> str:
    """CPU seconds per million rows by process group, the median over ``runs`` (each ``cpu_by_process``
    differences of one run of ``rows`` rows), and their total."""
    groups = sorted({k for r in runs for k in r})
    per_million = {g: statistics.median(r.get(g, 0.0) for r in runs) / rows * 1e6 for g in groups}
    return (", ".join(f"{g} {v:.2f}" for g, v in per_million.items() if v >= 0.005)
            + f" (total {sum(per_million.values()):.2f})")


def environment(command: str, mode: Mode, elapsed: float) -> list[str]:
    """The lines that say where and with what the numbers were measured."""
    import pyarrow as pa
    import pyspark

    from regional.spark.session import DELTA_PACKAGE

    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return [
        f"- command: `{command}` ({mode.name} mode, {mode.repeats} repeat(s), {elapsed / 60:.1f} min)",
        f"- machine: {os.cpu_count()} cores, {mem_gb:.0f} GB, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}",
        f"- versions: pyspark {pyspark.__version__}, regional {regional.__version__}, Delta {DELTA_PACKAGE}, "
        f"pyarrow {pa.__version__}",
    ]
