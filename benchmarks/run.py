"""Side-by-side benchmarks of ``regional`` against stock Spark, in one run on one machine.

    .venv/bin/python -m benchmarks.run --quick     # a few minutes, for routine runs
    .venv/bin/python -m benchmarks.run             # the full mode

Prints a table and writes ``BENCHMARKS.md`` and ``benchmarks/scenario2.png`` (see ``--out``).
Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import regional  # noqa: E402
from benchmarks.faults import transient_failure  # noqa: E402
from benchmarks.sections import markers  # noqa: E402
from regional.store import Store  # noqa: E402

REGIONS = [f"r{i:02d}" for i in range(16)]
FAILING = "r00"


@dataclass(frozen=True)
class Mode:
    name: str
    rows_per_file: int
    files_per_region: int
    repeats: int
    window_s: float  # scenario 2's failure window
    straggler_rows: int  # scenario 4: rows per region
    scale_regions: tuple[int, ...]
    store_epochs: int


QUICK = Mode("quick", 2_000, 4, 1, 12.0, 800, (16, 256, 1000), 300)
FULL = Mode("full", 10_000, 8, 3, 40.0, 3_000, (16, 256, 1000), 1000)


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


def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    """min / median / max over repeats."""
    if len(values) == 1:
        return fmt.format(values[0])
    return "/".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


# -- input -------------------------------------------------------------------------------------


def write_input(root: Path, mode: Mode) -> int:
    """16 regions of text files, one sub-directory per region (the layout both sources read)."""
    # File by file across the regions, so that stock Spark's file source (which goes by modification
    # time) reads every region in every batch, as regional does.
    for f in range(mode.files_per_region):
        for region in REGIONS:
            directory = root / region
            directory.mkdir(parents=True, exist_ok=True)
            lines = (f"{region} record {f * mode.rows_per_file + i:08d} " + "payload-" * 10
                     for i in range(mode.rows_per_file))
            (directory / f"{f:05d}.txt").write_text("\n".join(lines) + "\n")
    return len(REGIONS) * mode.files_per_region * mode.rows_per_file


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
                transform: Callable | None = None):
    from pyspark.sql import functions as F

    df = (spark.readStream.format("text").option("maxFilesPerTrigger", str(files_per_batch))
          .load(str(inp / "*" / "*.txt"))
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


# -- scenario 1 ----------------------------------------------------------------------------------


def pyarrow_reference(inp: Path, out: Path) -> float:
    """The same bytes read, upper-cased and written as parquet with pyarrow, outside Spark."""
    began = time.perf_counter()
    for directory in sorted(inp.iterdir()):
        lines = []
        for f in sorted(directory.iterdir()):
            lines.extend(f.read_text().splitlines())
        table = pa.table({"region": [directory.name] * len(lines), "value": pc.utf8_upper(pa.array(lines))})
        out.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, out / f"{directory.name}.parquet", compression="snappy")
    return time.perf_counter() - began


def scenario_1(spark, work: Path, mode: Mode, inp: Path, rows: int) -> list[Row]:
    epochs = 4
    per_epoch = mode.rows_per_file * mode.files_per_region // epochs
    files_per_batch = len(REGIONS) * mode.files_per_region // epochs
    times: dict[str, list[float]] = {"regional": [], "stock": [], "pyarrow": []}
    for i in range(mode.repeats):
        d = work / f"s1-{i}"
        times["stock"].append(timed(lambda d=d: stock_query(spark, inp, d / "stock", d / "stock-ck", files_per_batch)))
        times["regional"].append(timed(lambda d=d: regional_query(spark, inp, d / "reg", d / "reg-ck", per_epoch)))
        times["pyarrow"].append(pyarrow_reference(inp, d / "pyarrow"))
        counts = (rows, delta_rows(d / "reg"), delta_rows(d / "stock"))
        assert len(set(counts)) == 1, f"input, regional, stock rows differ: {counts}"
    rate = {k: [rows / t for t in v] for k, v in times.items()}
    ratio = statistics.median(rate["regional"]) / statistics.median(rate["stock"])
    ref = statistics.median(rate["pyarrow"])
    return [Row("1. fault-free throughput, 16 regions, text -> Delta", "rows/s (min/median/max)",
                spread(rate["stock"]), spread(rate["regional"]), f"{ratio:.2f}x", ">= 0.9x stock",
                "yes" if ratio >= 0.9 else "no",
                [f"pyarrow outside Spark, same bytes: {ref:,.0f} rows/s (regional at "
                 f"{statistics.median(rate['regional']) / ref:.2f}x, stock at "
                 f"{statistics.median(rate['stock']) / ref:.2f}x of it)"])]


# -- scenario 2 ----------------------------------------------------------------------------------


class Sampler:
    """Samples a cumulative count every ``interval`` seconds on a thread."""

    def __init__(self, count: Callable[[], int], interval: float = 0.25) -> None:
        self.count, self.interval = count, interval
        self.samples: list[tuple[float, int]] = []
        self.t0 = time.perf_counter()
        self.window = (0.0, 0.0)  # the failure window, in seconds since t0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.perf_counter() - self.t0, self.count()))
            except Exception:
                pass
            self._stop.wait(self.interval)

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def rate(self, start: float, end: float) -> float:
        inside = [(t, n) for t, n in self.samples if start <= t <= end]
        if len(inside) < 2:
            return 0.0
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def healthy_committed(ck: Path) -> int:
    record = Store(ck).latest_record()
    return sum(s.committed_offset for r, s in (record.regions.items() if record else ()) if r != FAILING)


def run_regional_window(spark, inp: Path, d: Path, mode: Mode, fail: bool) -> Sampler:
    marker = d / "down"
    per_epoch = max(1, mode.rows_per_file // 4)
    query = regional_query(spark, inp, d / "out", d / "ck", per_epoch, available_now=False,
                           target="python:benchmarks.faults:DownWhileMarked", failRegion=FAILING,
                           downMarker=str(marker), maxConsecutiveFailures="1000")
    sampler = Sampler(lambda: healthy_committed(d / "ck"))
    try:
        _wait_until(lambda: healthy_committed(d / "ck") > 0, 120)
        if fail:
            marker.touch()
        start = time.perf_counter() - sampler.t0
        time.sleep(mode.window_s)
        marker.unlink(missing_ok=True)
        sampler.window = (start, time.perf_counter() - sampler.t0)
        time.sleep(3)
    finally:
        query.stop()
        sampler.stop()
    return sampler


def run_stock_window(spark, inp: Path, d: Path, mode: Mode, fail: bool) -> tuple[Sampler, int]:
    """Stock Spark with a sink write that raises for the failing region's rows, restarted in a loop by a
    supervisor, as users' supervisors do. Counts every committed row (all regions: the batch is one unit)."""
    from pyspark.sql import functions as F

    marker = str(d / "down")

    @F.udf("string")
    def write_or_fail(region: str, value: str) -> str:
        if region == FAILING and os.path.exists(marker):
            raise ConnectionError(f"target of region {region} is down (benchmark fault)")
        return value.upper()

    files_per_batch = len(REGIONS)

    def start():
        return stock_query(spark, inp, d / "out", d / "ck", files_per_batch, available_now=False,
                           transform=lambda df: write_or_fail("region", "value"))

    sampler = Sampler(lambda: delta_rows(d / "out"))
    restarts = 0
    query = start()
    try:
        _wait_until(lambda: delta_rows(d / "out") > 0, 120)
        if fail:
            Path(marker).touch()
        window_start = time.perf_counter() - sampler.t0
        deadline = time.perf_counter() + mode.window_s
        while time.perf_counter() < deadline:
            if not query.isActive:  # the supervisor: restart the failed query from its checkpoint
                restarts += 1
                query = start()
            time.sleep(0.2)
        Path(marker).unlink(missing_ok=True)
        sampler.window = (window_start, time.perf_counter() - sampler.t0)
        if not query.isActive:
            query = start()
        time.sleep(3)
    finally:
        query.stop()
        sampler.stop()
    return sampler, restarts


def scenario_2(spark, work: Path, mode: Mode, inp: Path, png: Path) -> list[Row]:
    healthy_share = (len(REGIONS) - 1) / len(REGIONS)
    reg_free, reg_fail, stock_free, stock_fail, restarts = [], [], [], [], []
    plot = None
    for i in range(mode.repeats):
        base = run_regional_window(spark, inp, work / f"s2-reg-free-{i}", mode, fail=False)
        faulty = run_regional_window(spark, inp, work / f"s2-reg-fail-{i}", mode, fail=True)
        reg_free.append(base.rate(*base.window))
        reg_fail.append(faulty.rate(*faulty.window))
        sbase, _ = run_stock_window(spark, inp, work / f"s2-stock-free-{i}", mode, fail=False)
        sfail, n = run_stock_window(spark, inp, work / f"s2-stock-fail-{i}", mode, fail=True)
        stock_free.append(sbase.rate(*sbase.window) * healthy_share)  # the healthy regions' share
        stock_fail.append(sfail.rate(*sfail.window) * healthy_share)
        restarts.append(n)
        plot = (faulty, sfail)
    reg_ratio = statistics.median(reg_fail) / statistics.median(reg_free)
    stock_ratio = statistics.median(stock_fail) / max(statistics.median(stock_free), 1e-9)
    if plot is not None:
        draw_scenario_2(plot[0], plot[1], png)
    return [Row(f"2. one of 16 regions failing for {mode.window_s:.0f}s", "healthy regions' committed rows/s "
                "in the window, as a share of fault-free", f"{stock_ratio:.2f}", f"{reg_ratio:.2f}",
                f"{reg_ratio:.2f}x", ">= 0.9x fault-free", "yes" if reg_ratio >= 0.9 else "no",
                [f"healthy rows/s fault-free / in the window: regional {spread(reg_free)} / {spread(reg_fail)}, "
                 f"stock {spread(stock_free)} / {spread(stock_fail)} (stock restarted {spread(restarts)} times "
                 "by the supervisor loop)"])]


def draw_scenario_2(reg: Sampler, stock: Sampler, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for sampler, label, color in ((reg, "regional (15 healthy regions)", "tab:blue"),
                                  (stock, "stock Spark + supervisor restarts (all rows)", "tab:red")):
        t0 = sampler.window[0]
        ax.plot([t - t0 for t, _ in sampler.samples], [n for _, n in sampler.samples], label=label, color=color)
    ax.axvspan(0, reg.window[1] - reg.window[0], color="grey", alpha=0.2,
               label=f"region {FAILING}'s target down")
    ax.set_xlabel("seconds since the failure began")
    ax.set_ylabel("committed rows")
    ax.set_title("Scenario 2: one of 16 regions failing")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# -- scenario 3 ----------------------------------------------------------------------------------


def scenario_3(spark, work: Path, mode: Mode, inp: Path, rows: int) -> list[Row]:
    from pyspark.sql import functions as F

    share = 0.05
    epochs = 8
    per_epoch = mode.rows_per_file * mode.files_per_region // epochs
    reg_extra, stock_extra, reg_failed_share, stock_failed_share, reg_wasted_share = [], [], [], [], []
    for i in range(mode.repeats):
        d = work / f"s3-{i}"
        d.mkdir(parents=True)
        timed(lambda d=d: regional_query(spark, inp, d / "reg", d / "reg-ck", per_epoch,
                                     target="python:benchmarks.faults:FailsAfterWork", failShare=str(share),
                                     faultDir=str(d), maxConsecutiveFailures="1000"))
        wasted_file = d / "wasted-rows"
        wasted = sum(int(x) for x in wasted_file.read_text().split()) if wasted_file.exists() else 0
        assert delta_rows(d / "reg") == rows
        reg_extra.append(wasted / rows)
        reg_wasted_share.append(wasted / (rows + wasted))
        records = regional.status(d / "reg-ck").epochs
        pairs = sum(len(e.committed) + len(e.fallen_back) for e in records)
        reg_failed_share.append(sum(len(e.fallen_back) for e in records) / max(pairs, 1))

        healed = d / "healed"
        healed.mkdir()
        marker_dir = str(healed)

        @F.udf("string")
        def write_or_fail(region: str, value: str) -> str:
            from pyspark import TaskContext

            batch = int(TaskContext.get().getLocalProperty("streaming.sql.batchId") or -1)
            healed = os.path.exists(f"{marker_dir}/{batch}-{region}")  # noqa: B023 (called within the iteration)
            if transient_failure(batch, region, share) and not healed:
                raise TimeoutError(f"region {region} batch {batch}: target timed out (benchmark fault)")
            return value.upper()

        files_per_batch = len(REGIONS) * mode.files_per_region // epochs
        failed_batches: set[int] = set()
        batch_rows: dict[int, int] = {}
        while True:  # the supervisor loop: restart after each failure, healing that batch's fault
            query = stock_query(spark, inp, d / "stock", d / "stock-ck", files_per_batch,
                                transform=lambda df: write_or_fail("region", "value"))
            try:
                query.awaitTermination()
            except Exception:  # the injected failure; the supervisor restarts below
                pass
            for p in query.recentProgress:
                batch_rows[p.batchId] = p.numInputRows
            if query.exception() is None:
                break
            batch = _failed_batch(d / "stock-ck")
            failed_batches.add(batch)
            for region in REGIONS:
                (healed / f"{batch}-{region}").touch()
        assert delta_rows(d / "stock") == rows
        # A failed batch is redone whole after the restart; its rows were (up to) all processed before.
        stock_extra.append(sum(batch_rows.get(b, 0) for b in failed_batches) / rows)
        stock_failed_share.append(len(failed_batches) / max(len(batch_rows), 1))
    reg_med, stock_med = statistics.median(reg_extra), statistics.median(stock_extra)
    failed, wasted_share = statistics.median(reg_failed_share), statistics.median(reg_wasted_share)
    return [Row("3. transient failures, 5% of region-epochs", "extra rows processed per row committed",
                spread(stock_extra, "{:.3f}"), spread(reg_extra, "{:.3f}"),
                f"{reg_med / stock_med:.2f}x" if stock_med else "-",
                "regional's wasted share of the work <= the failed share of region-epochs",
                "yes" if wasted_share <= failed * 1.05 else "no",
                [f"regional: {wasted_share:.4f} of the rows processed were lost in failed slices; "
                 f"{failed:.4f} of the region-epochs failed. Stock: {spread(stock_failed_share, '{:.3f}')} of "
                 "its batches failed and each was redone whole (extra counts each failed batch's rows once)"])]


def _failed_batch(ck: Path) -> int:
    offsets = sorted(int(p.name) for p in (ck / "offsets").iterdir() if p.name.isdigit())
    commits = {int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit()} if (ck / "commits").exists() \
        else set()
    return next(b for b in reversed(offsets) if b not in commits)


# -- scenario 4 ----------------------------------------------------------------------------------


def scenario_4(spark, work: Path, mode: Mode) -> list[Row]:
    from pyspark.sql import functions as F

    inp = work / "s4-in"
    for region in REGIONS:
        (inp / region).mkdir(parents=True)
        (inp / region / "00000.txt").write_text("".join(f"{region} {i}\n" for i in range(mode.straggler_rows)))
    per_row = 0.001  # seconds of work per row; the straggler takes ten times as long

    def slow(straggler: bool):
        @F.pandas_udf("string")
        def work_udf(region, value):
            cost = sum(per_row * (10 if straggler and r == FAILING else 1) for r in region)
            time.sleep(cost)
            return value.str.upper()

        return lambda df: work_udf("region", "value")

    epochs = 4
    per_epoch = mode.straggler_rows // epochs
    results: dict[str, list[tuple[list[float], float]]] = {k: [] for k in ("free", "stock", "plain", "timeout")}
    for i in range(mode.repeats):
        d = work / f"s4-{i}"
        runs = {
            "free": lambda d=d: regional_query(spark, inp, d / "free", d / "free-ck", per_epoch,
                                               transform=slow(False)),
            "stock": lambda d=d: stock_query(spark, inp, d / "stock", d / "stock-ck", 4, transform=slow(True)),
            "plain": lambda d=d: regional_query(spark, inp, d / "plain", d / "plain-ck", per_epoch,
                                                transform=slow(True)),
            "timeout": lambda d=d: regional_query(spark, inp, d / "tmo", d / "tmo-ck", per_epoch,
                                                  transform=slow(True), regionTimeout="1s"),
        }
        for name, start in runs.items():
            began = time.perf_counter()
            query = start()
            query.awaitTermination()
            wall = time.perf_counter() - began
            latencies = [p.durationMs.get("triggerExecution", 0) / 1000 for p in query.recentProgress
                         if p.numInputRows > 0]
            results[name].append((latencies, wall))

    def pct(name: str, q: float) -> float:
        values = sorted(x for lat, _ in results[name] for x in lat)
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")

    healthy = (len(REGIONS) - 1) * mode.straggler_rows
    rate = {k: statistics.median(healthy / wall for _, wall in v) for k, v in results.items()}
    p50_ratio = pct("timeout", 0.5) / pct("free", 0.5)
    return [Row("4. one straggler region (UDF 10x slower)", "epoch latency p50 / p99 (s)",
                f"{pct('stock', .5):.2f} / {pct('stock', .99):.2f}",
                f"no timeout {pct('plain', .5):.2f} / {pct('plain', .99):.2f}; regionTimeout=1s "
                f"{pct('timeout', .5):.2f} / {pct('timeout', .99):.2f}",
                f"{p50_ratio:.2f}x", "p50 with timeout <= 1.2x fault-free", "yes" if p50_ratio <= 1.2 else "no",
                [f"fault-free regional p50 / p99: {pct('free', .5):.2f} / {pct('free', .99):.2f} s; healthy "
                 f"regions' rows/s over the whole run: stock {rate['stock']:,.0f}, regional without timeout "
                 f"{rate['plain']:,.0f}, with timeout {rate['timeout']:,.0f}, fault-free {rate['free']:,.0f}"])]


# -- scenario 5 ----------------------------------------------------------------------------------


class NullTarget:
    def prepare(self, epoch, region, batches):
        raise AssertionError("not used")

    def commit(self, epoch, handles):
        pass

    def abort(self, epoch, handles):
        pass


def scenario_5(work: Path, mode: Mode) -> list[Row]:
    """The driver's part of an epoch (decide, publish one Delta transaction, record), without Spark:
    staged files are written first, as the tasks would."""
    from regional.protocol.epoch import Status, TaskOutcome, commit_epoch, plan_epoch
    from regional.protocol.settings import Settings
    from regional.store import Store
    from regional.targets import load_target

    timings = {}
    for n in mode.scale_regions:
        d = work / f"s5-{n}"
        store = Store(d / "ck")
        query_id = store.open_query()
        committer = load_target({"target": "delta", "path": str(d / "table"), "queryid": query_id})
        regions = [f"region-{i:04d}" for i in range(n)]
        batch = pa.record_batch({"value": pa.array(["x"] * 10)})
        per_epoch = []
        for epoch in range(6):
            plan = plan_epoch(epoch, query_id, str(store.checkpoint), store.region_states(),
                              dict.fromkeys(regions, (epoch + 1) * 10), Settings())
            reports = [TaskOutcome(i, 0, Status.WRITTEN, query_id, rr.region, rr.start, rr.end, 10, rr.start,
                                   rr.end - 1, committer.prepare(epoch, rr.region, iter([batch])))
                       for i, rr in enumerate(plan.regions)]
            began = time.perf_counter()
            commit_epoch(plan, reports, store, committer)
            per_epoch.append(time.perf_counter() - began)
        timings[n] = statistics.median(per_epoch[1:])  # epoch 0 also creates the table

    d = work / "s5-store"
    store = Store(d)
    query_id = store.open_query()
    sizes = []
    regions = [f"region-{i:02d}" for i in range(16)]
    for epoch in range(mode.store_epochs):
        plan = plan_epoch(epoch, query_id, str(store.checkpoint), store.region_states(),
                          dict.fromkeys(regions, epoch + 1), Settings())
        reports = [TaskOutcome(i, 0, Status.FAILED if (rr.region == regions[0] and epoch % 50 < 10) else Status.WRITTEN,
                               query_id, rr.region, rr.start, rr.end, 1, rr.start, rr.end - 1, None, "down")
                   for i, rr in enumerate(plan.regions)]
        commit_epoch(plan, reports, store, NullTarget())
        if epoch + 1 in (100, mode.store_epochs // 2, mode.store_epochs):
            sizes.append((epoch + 1, sum(f.stat().st_size for f in store.root.rglob("*") if f.is_file())))
    worst = timings[max(timings)]
    bounded = sizes[-1][1] <= sizes[0][1] * 1.2
    return [Row("5. driver work per epoch (decide + publish + record)", "ms per epoch by region count", "-",
                ", ".join(f"{n}: {t * 1000:.0f}" for n, t in timings.items()), "-",
                "<= 200 ms at 1,000 regions", "yes" if worst <= 0.2 else "no",
                ["store size with retainEpochs=100 after " + ", ".join(f"{e} epochs: {s / 1024:.0f} KiB"
                                                                       for e, s in sizes)
                 + (" (bounded)" if bounded else " (GROWING)")])]


# -- driver ---------------------------------------------------------------------------------------


def _wait_until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark query made no progress")
        time.sleep(0.1)


def render(rows: list[Row], command: str, mode: Mode, elapsed: float) -> str:
    import pyspark

    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    lines = [
        "# Benchmarks",
        "",
        f"- command: `{command}` ({mode.name} mode, {mode.repeats} repeat(s), {elapsed / 60:.1f} min)",
        f"- machine: {os.cpu_count()} cores, {mem_gb:.0f} GB, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}",
        f"- versions: pyspark {pyspark.__version__}, regional {regional.__version__}, "
        f"Delta {regional.spark.session.DELTA_PACKAGE}, pyarrow {pa.__version__}",
        f"- date: {datetime.date.today().isoformat()}",
        "- Spark `local[2,4]`, `spark.sql.execution.arrow.maxRecordsPerBatch=100`; stock and regional in the "
        "same session, on the same input, in the same run.",
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

- Scenario 1: at these sizes both pipelines are dominated by per-batch overhead (Delta commits, Python
  worker start-up), far from the pyarrow reference; stock's text source plus delta-spark's sink pays more
  per batch than regional's one Delta transaction per epoch. Larger inputs (full mode) narrow the gap.
- Scenario 2: regional keeps committing the 15 healthy regions while stock Spark commits nothing in the
  window (every restart fails the same batch again). The healthy regions' rate drops by about a quarter
  instead of the 1/16 the failing region's share would explain: epochs take about 1.15 s instead of
  0.95 s. Not yet profiled; next step: py-spy on the driver and the Python workers during the window
  (the failing task's exception path, and the source re-reading the failing region's slice, are the suspects).
- Scenario 4: `regionTimeout` does not shorten epochs here. The straggler's slice (a few hundred short
  records) is already inside the pipeline between source and UDF when the clock runs out, and what is
  in the pipeline is still processed and published (measured limit, see README); the cut only helps when
  a region's epoch backlog is larger than those buffers (about 20 MB). Larger records or backlogs would
  show it; a fix is a cut inside the sink (publish a prefix of what it received), not in the source.
"""


# Sections written by the other benchmark modules (benchmarks.kafka, benchmarks.postgres); they stay.
KEPT_SECTIONS = ("kafka", "postgres", "dead-letters")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes and one repeat")
    parser.add_argument("--only", default="12345", help="scenarios to run, e.g. 15")
    parser.add_argument("--out", default=str(ROOT), help="where BENCHMARKS.md and the PNG go")
    args = parser.parse_args(argv)
    mode = QUICK if args.quick else FULL
    command = "python -m benchmarks.run" + (" --quick" if args.quick else "")
    out = Path(args.out)
    began = time.perf_counter()
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix="regional-bench-"))
    try:
        if "5" in args.only:
            rows += scenario_5(work, mode)
            print(rows[-1], flush=True)
        if set(args.only) & set("1234"):
            spark = regional.local_spark("local[2,4]", "regional-benchmarks", {
                "spark.sql.shuffle.partitions": "2",
                # small Arrow batches, so that a slow UDF hands rows to the sink early (regionTimeout)
                "spark.sql.execution.arrow.maxRecordsPerBatch": "100"})
            regional.register(spark)
            spark.sparkContext.setLogLevel("OFF")
            inp = work / "in"
            rows_total = write_input(inp, mode)
            if "1" in args.only:
                rows[:0] = scenario_1(spark, work, mode, inp, rows_total)
                print(rows[0], flush=True)
            if "2" in args.only:
                rows += scenario_2(spark, work, mode, inp, out / "benchmarks" / "scenario2.png")
                print(rows[-1], flush=True)
            if "3" in args.only:
                rows += scenario_3(spark, work, mode, inp, rows_total)
                print(rows[-1], flush=True)
            if "4" in args.only:
                rows += scenario_4(spark, work, mode)
                print(rows[-1], flush=True)
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows.sort(key=lambda r: r.scenario)
    report = render(rows, command, mode, time.perf_counter() - began)
    target = out / "BENCHMARKS.md"
    previous = target.read_text() if target.exists() else ""
    for name in KEPT_SECTIONS:
        begin, end = markers(name)
        if begin in previous and end in previous:
            report += "\n" + previous[previous.index(begin):previous.index(end) + len(end)] + "\n"
    target.write_text(report)
    print(report)
    (out / "benchmarks" / "last-run.json").write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
