"""Scenario 3: one region's UDF ten times slower; epoch latency with and without ``regionTimeout``."""

from __future__ import annotations

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
        @F.pandas_udf("string")
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
          per_epoch: int) -> dict[str, list[tuple[list[float], float]]]:
    results: dict[str, list[tuple[list[float], float]]] = {k: [] for k in ("free", "stock", "plain", "timeout")}
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
            latencies = [p.durationMs.get("triggerExecution", 0) / 1000 for p in query.recentProgress
                         if p.numInputRows > 0]
            results[name].append((latencies, wall))
    return results


def _report(results: dict[str, list[tuple[list[float], float]]], mode: Mode) -> list[Row]:
    def pct(name: str, q: float) -> float:
        values = sorted(x for lat, _ in results[name] for x in lat)
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")

    healthy = (len(REGIONS) - 1) * mode.straggler_rows
    rate = {k: statistics.median(healthy / wall for _, wall in v) for k, v in results.items()}
    p50_ratio = pct("timeout", 0.5) / pct("free", 0.5)
    return [Row("3. one straggler region (UDF 10x slower)", "epoch latency p50 / p99 (s)",
                f"{pct('stock', .5):.2f} / {pct('stock', .99):.2f}",
                f"no timeout {pct('plain', .5):.2f} / {pct('plain', .99):.2f}; regionTimeout=1s "
                f"{pct('timeout', .5):.2f} / {pct('timeout', .99):.2f}",
                f"{p50_ratio:.2f}x", "p50 with timeout <= 1.2x fault-free", "yes" if p50_ratio <= 1.2 else "no",
                [f"fault-free regional p50 / p99: {pct('free', .5):.2f} / {pct('free', .99):.2f} s; healthy "
                 f"regions' rows/s over the whole run: stock {rate['stock']:,.0f}, regional without timeout "
                 f"{rate['plain']:,.0f}, with timeout {rate['timeout']:,.0f}, fault-free {rate['free']:,.0f}"])]
