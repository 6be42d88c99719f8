"""Scenario 3: one region's UDF ten times slower; epoch latency with and without ``regionTimeout``."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import FAILING, REGIONS, Mode, Row, regional_query, stock_query


def run(spark, work: Path, mode: Mode) -> list[Row]:
    from pyspark.sql import functions as F

    inp = work / "straggler-in"
    for region in REGIONS:
        (inp / region).mkdir(parents=True)
        (inp / region / "00000.txt").write_text("".join(f"{region} {i}\n" for i in range(mode.straggler_rows)))
    per_row = 0.001  # seconds of work per row; the straggler takes ten times as long

    def slow(straggler: bool):
        @F.pandas_udf("string")  # type: ignore[call-overload]  # pyspark's stubs lack the one-argument form
        def work_udf(region, value):
            cost = sum(per_row * (10 if straggler and r == FAILING else 1) for r in region)
            time.sleep(cost)
            return value.str.upper()

        return lambda df: work_udf("region", "value")

    epochs = 4
    per_epoch = mode.straggler_rows // epochs
    # Small Arrow batches, so that a slow UDF hands rows on early (what regionTimeout needs to cut).
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        results = _runs(spark, work, mode, inp, slow, per_epoch)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    return _report(results, mode)


def _runs(spark, work: Path, mode: Mode, inp: Path, slow: Callable[[bool], Callable],
          per_epoch: int) -> dict[str, list[tuple[list[float], float, float]]]:
    results: dict[str, list[tuple[list[float], float, float]]] = {
        k: [] for k in ("free", "stock", "plain", "timeout")}
    for i in range(mode.repeats):
        d = work / f"straggler-{i}"
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
            # The epochs that carried healthy regions' records: how long the healthy regions waited. (Epochs of
            # the straggler alone, once the others are done, wait for no one.)
            progress = [p for p in query.recentProgress if p.numInputRows > 0]
            latencies = [p.durationMs.get("triggerExecution", 0) / 1000 for p in progress if _plans_healthy_regions(p)]
            # Seconds of epochs until the healthy regions' last records were published.
            last = max((i for i, p in enumerate(progress) if _plans_healthy_regions(p)), default=-1)
            healthy_done = sum(p.durationMs.get("triggerExecution", 0) / 1000 for p in progress[:last + 1])
            results[name].append((latencies, wall, healthy_done))
    return results


def _plans_healthy_regions(progress) -> bool:
    """Whether an epoch's plan (regional's offset) or input (stock: every batch holds every region) has
    records of a region other than the straggler."""
    offset = json.loads(progress.sources[0].endOffset or "{}")
    if "regions" not in offset:
        return True
    return any(region != FAILING for region, *_rest in offset["regions"])


def _report(results: dict[str, list[tuple[list[float], float, float]]], mode: Mode) -> list[Row]:
    def pct(name: str, q: float) -> float:
        values = sorted(x for lat, _wall, _done in results[name] for x in lat)
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")

    healthy = (len(REGIONS) - 1) * mode.straggler_rows
    rate = {k: statistics.median(healthy / wall for _, wall, _done in v) for k, v in results.items()}
    until = {k: statistics.median(healthy / max(done, 1e-9) for _, _wall, done in v) for k, v in results.items()}
    p50_ratio = pct("timeout", 0.5) / pct("free", 0.5)
    return [Row("3. one straggler region (UDF 10x slower)",
                "latency p50 / p99 (s) of epochs with healthy regions' records",
                f"{pct('stock', .5):.2f} / {pct('stock', .99):.2f}",
                f"no timeout {pct('plain', .5):.2f} / {pct('plain', .99):.2f}; regionTimeout=1s "
                f"{pct('timeout', .5):.2f} / {pct('timeout', .99):.2f}",
                f"{p50_ratio:.2f}x", "p50 with timeout <= 1.2x fault-free", "yes" if p50_ratio <= 1.2 else "no",
                [f"fault-free regional p50 / p99: {pct('free', .5):.2f} / {pct('free', .99):.2f} s; healthy "
                 f"regions' rows/s until their last record (epoch time): stock {until['stock']:,.0f}, regional "
                 f"without timeout {until['plain']:,.0f}, with timeout {until['timeout']:,.0f}, fault-free "
                 f"{until['free']:,.0f}; over the whole run (the straggler's own tail included): stock "
                 f"{rate['stock']:,.0f}, without timeout {rate['plain']:,.0f}, with timeout {rate['timeout']:,.0f}, "
                 f"fault-free {rate['free']:,.0f}"])]
