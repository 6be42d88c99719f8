"""Scenario 4: many regions.

- The driver's work per epoch by region count, without Spark: planning, deciding and recording (the store),
  and publishing one Delta transaction, timed apart. Staged files are written first, as tasks would.
- Epoch latency of a real query that knows many regions, ten of them with data per epoch, against one that
  knows 16 (only regions with work get tasks).
- The store's size over many epochs with ``retainEpochs=100``.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.common import Footprint, Mode, Row, delta_rows, spread
from regional.coordinator import commit_epoch
from regional.protocol.decide import Outcome, TaskOutcome
from regional.protocol.plan import plan_epoch
from regional.protocol.settings import Settings
from regional.store import Store
from regional.targets import load_target
from regional.targets.base import Target

ACTIVE = 10  # regions with data per epoch


class NullTarget(Target):
    """Publishes nothing: the driver's own work, timed without a target's."""

    def prepare(self, epoch, region, batches):
        raise AssertionError("not used")

    def commit(self, epoch, handles, report=None):
        pass

    def abort(self, epoch, handles):
        pass


class DeltaRsClock:
    """Time spent inside delta-rs's own calls (bring the table up to date, read the app transaction, commit):
    the part of the Delta publish that is delta-rs's, not regional's."""

    CALLS = ("update_incremental", "transaction_version", "create_write_transaction")

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        from deltalake import DeltaTable

        originals = {name: getattr(DeltaTable, name) for name in self.CALLS}

        def timed(call: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any, **kwargs: Any) -> Any:
                began = time.perf_counter()
                try:
                    return call(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - began
            return run

        for name, call in originals.items():
            setattr(DeltaTable, name, timed(call))
        try:
            yield
        finally:
            for name, call in originals.items():
                setattr(DeltaTable, name, call)


def driver_work(work: Path, regions: int, epochs: int = 11, active: int | None = None) -> dict[str, list[float]]:
    """Seconds per epoch (after the first, which creates the store's files and the table) of plan, decide +
    record (a target that publishes nothing), and the same with one Delta transaction publishing every staged
    file, and of that, delta-rs's own calls. Every region has new data each epoch, or ``active`` of them."""
    names = [f"region-{i:05d}" for i in range(regions)]
    timings: dict[str, list[float]] = {"plan": [], "decide+record": [], "with Delta publish": [], "delta-rs": []}
    batch = pa.record_batch({"value": pa.array(["x"] * 10)})
    for target_name in ("null", "delta"):
        store = Store(Path(tempfile.mkdtemp(dir=work)) / "ck")
        query_id = store.open_query()
        target = NullTarget() if target_name == "null" else load_target(
            {"target": "delta", "path": str(Path(tempfile.mkdtemp(dir=work)) / "table"), "queryid": query_id})
        ends = dict.fromkeys(names, 0)
        for epoch in range(epochs):
            moving = names if active is None or epoch == 0 else [
                names[(epoch * active + k) % regions] for k in range(active)]
            for name in moving:
                ends[name] += 10
            began = time.perf_counter()
            plan = plan_epoch(epoch, query_id, str(store.checkpoint), store.region_states(), dict(ends), Settings())
            planned = time.perf_counter()
            handles = {rr.region: None if target_name == "null" else target.prepare(epoch, rr.region, iter([batch]))
                       for rr in plan.regions}
            reports = [TaskOutcome(i, 0, Outcome.WRITTEN, query_id, rr.region, rr.start, rr.end, 10, rr.start,
                                   rr.end - 1, handles[rr.region]) for i, rr in enumerate(plan.regions)]
            clock = DeltaRsClock()
            staged = time.perf_counter()
            with clock.counting():
                commit_epoch(plan, reports, store, target)
            done = time.perf_counter()
            if epoch:  # epoch 0 also creates the store's files and the table
                if target_name == "null":
                    timings["plan"].append(planned - began)
                    timings["decide+record"].append(done - staged)
                else:
                    timings["with Delta publish"].append(done - staged)
                    timings["delta-rs"].append(clock.seconds)
    timings["plan + decide + record"] = [a + b for a, b in zip(timings["plan"], timings["decide+record"],
                                                                 strict=True)]
    timings["plan + decide + record + Delta publish"] = [a + b for a, b in zip(
        timings["plan"], timings["with Delta publish"], strict=True)]
    return timings


def store_sizes(work: Path, mode: Mode) -> list[tuple[int, int]]:
    store = Store(work / "store-sizes")
    query_id = store.open_query()
    sizes = []
    regions = [f"region-{i:02d}" for i in range(16)]
    for epoch in range(mode.store_epochs):
        plan = plan_epoch(epoch, query_id, str(store.checkpoint), store.region_states(),
                          dict.fromkeys(regions, epoch + 1), Settings())
        down = epoch % 50 < 10
        reports = [TaskOutcome(i, 0, Outcome.FAILED if (rr.region == regions[0] and down) else Outcome.WRITTEN,
                               query_id, rr.region, rr.start, rr.end, 1, rr.start, rr.end - 1, None, "down")
                   for i, rr in enumerate(plan.regions)]
        commit_epoch(plan, reports, store, NullTarget())
        if epoch + 1 in (100, mode.store_epochs // 2, mode.store_epochs):
            sizes.append((epoch + 1, sum(f.stat().st_size for f in store.root.rglob("*") if f.is_file())))
    return sizes


def epoch_latency(spark, work: Path, known: int, epochs: int = 6) -> tuple[float, Footprint]:
    """Median seconds per epoch (Spark's triggerExecution) of a running query that knows ``known`` regions,
    after ``ACTIVE`` of them get a new file each."""
    inp, out, ck = work / f"lat-{known}-in", work / f"lat-{known}-out", work / f"lat-{known}-ck"
    regions = [f"r{i:05d}" for i in range(known)]
    for region in regions:  # every region known: one line each, read by the first epoch
        (inp / region).mkdir(parents=True)
        (inp / region / "00000.txt").write_text(f"{region} 0\n")
    query = (spark.readStream.format("regional").option("source", "files").option("path", str(inp)).load()
             .writeStream.format("regional").option("target", "delta").option("path", str(out))
             .option("checkpointLocation", str(ck)).start())
    footprint = Footprint()
    latencies = []
    try:
        query.processAllAvailable()
        rows = known
        for epoch in range(1, epochs + 1):
            for region in (regions[(epoch * ACTIVE + k) % known] for k in range(ACTIVE)):
                body = "".join(f"{region} {epoch}-{i}\n" for i in range(1000))
                tmp = inp / region / f".{epoch:05d}.txt"
                tmp.write_text(body)
                tmp.rename(inp / region / f"{epoch:05d}.txt")
            rows += ACTIVE * 1000
            before = query.lastProgress.batchId if query.lastProgress else -1
            query.processAllAvailable()
            assert delta_rows(out) == rows, f"the query lost or doubled rows: {delta_rows(out)} != {rows}"
            latencies += [p.durationMs.get("triggerExecution", 0) / 1000 for p in query.recentProgress
                          if p.batchId > before and p.numInputRows > 0]
    finally:
        query.stop()
        footprint.stop()
    return statistics.median(latencies), footprint


def run(spark, work: Path, mode: Mode) -> list[Row]:
    driver = {n: driver_work(work, n) for n in mode.scale_regions}
    worst = max(mode.scale_regions)
    few = driver_work(work, worst, active=ACTIVE)
    sizes = store_sizes(work, mode)
    small, _ = epoch_latency(spark, work, 16)
    large, footprint = epoch_latency(spark, work, mode.known_regions)
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in driver.items()}
    driver_ms = med[worst]["plan + decide + record + Delta publish"]
    latency_ratio = large / small
    bounded = sizes[-1][1] <= sizes[0][1] * 1.2
    return [
        Row(f"4a. {mode.known_regions:,} known regions, {ACTIVE} with data per epoch", "epoch latency p50 (s)",
            "-", f"16 regions: {small:.2f}; {mode.known_regions:,} regions: {large:.2f}", f"{latency_ratio:.2f}x",
            "<= 1.5x that of 16 regions", "yes" if latency_ratio <= 1.5 else "no",
            [f"{mode.known_regions:,} regions: {footprint.describe()}"]),
        Row(f"4b. the driver's work per epoch at {worst:,} regions", "plan + decide + record + Delta publish (ms), "
            "median", "-", f"{driver_ms * 1000:.0f}", "-", "<= 100 ms", "yes" if driver_ms <= 0.1 else "no",
            ["ms per epoch by region count, medians of 10 epochs, plan / decide+record / decide+record with one "
             "Delta publish: " + "; ".join(f"{n:,}: {t['plan'] * 1000:.0f} / {t['decide+record'] * 1000:.0f} / "
                                          f"{t['with Delta publish'] * 1000:.0f}" for n, t in med.items()),
             f"spread at {worst:,} regions, ms per epoch min/median/max over 10 epochs: plan + decide + record "
             + spread([v * 1000 for v in driver[worst]['plan + decide + record']])
             + "; with the Delta publish of every region's file "
             + spread([v * 1000 for v in driver[worst]['plan + decide + record + Delta publish']])
             + f"; of that, delta-rs's own calls (update the table, read the app transaction, commit "
             f"{worst:,} files) " + spread([v * 1000 for v in driver[worst]['delta-rs']]),
             f"{worst:,} regions, {ACTIVE} with new data per epoch, ms per epoch min/median/max: plan + decide + "
             "record + Delta publish " + spread([v * 1000 for v in few['plan + decide + record + Delta publish']])
             + "; of that, delta-rs " + spread([v * 1000 for v in few['delta-rs']]),
             "store size with retainEpochs=100 after " + ", ".join(f"{e} epochs: {s / 1024:.0f} KiB"
                                                                  for e, s in sizes)
             + (" (bounded)" if bounded else " (GROWING)")]),
    ]
