"""Scenario 1: fault-free throughput at volume. 16 regions of text files (lines of about 200 bytes) into
Delta, against stock Spark's text source into delta-spark, and against pyarrow alone on the same bytes (the
limit: read, upper-case, write parquet, no Spark). Default Arrow batch sizes."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.common import (
    LINE_PAD,
    REGIONS,
    Footprint,
    Mode,
    Row,
    cpu_by_process,
    cpu_per_million,
    delta_rows,
    regional_query,
    spread,
    stock_query,
    timed,
    write_input,
)


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


def run(spark, work: Path, mode: Mode) -> list[Row]:
    inp = work / "volume-in"
    rows = write_input(inp, mode.volume_rows_per_file, mode.volume_files_per_region, LINE_PAD)
    size_mb = sum(f.stat().st_size for f in inp.rglob("*.txt")) / 2**20
    epochs = mode.volume_files_per_region  # one file per region per epoch, in both pipelines
    per_epoch = mode.volume_rows_per_file
    files_per_batch = len(REGIONS)
    times: dict[str, list[float]] = {"regional": [], "stock": [], "pyarrow": []}
    footprints: dict[str, Footprint] = {}
    cpu: dict[str, list[dict[str, float]]] = {"regional": [], "stock": [], "pyarrow": []}  # CPU s by process

    def measured(name: str, run: Callable[[], float]) -> float:
        footprints[name] = Footprint()
        before, process = cpu_by_process(), time.process_time()
        seconds = run()
        after, process = cpu_by_process(), time.process_time() - process
        footprints[name].stop()
        cpu[name].append({k: v - before[k] for k, v in after.items()} if name != "pyarrow" else {"Python": process})
        return seconds

    for i in range(mode.repeats + 1):  # run 0 warms the JVM and the Python workers up; it is not counted
        d = work / f"s1-{i}"
        stock = measured("stock", partial(timed, partial(stock_query, spark, inp, d / "stock", d / "stock-ck",
                                                         files_per_batch)))
        reg = measured("regional", partial(timed, partial(regional_query, spark, inp, d / "reg", d / "reg-ck",
                                                          per_epoch)))
        counts = (rows, delta_rows(d / "reg"), delta_rows(d / "stock"))
        assert len(set(counts)) == 1, f"input, regional, stock rows differ: {counts}"
        if i:
            times["stock"].append(stock)
            times["regional"].append(reg)
            times["pyarrow"].append(measured("pyarrow", partial(pyarrow_reference, inp, d / "pyarrow")))
        else:
            cpu["stock"].clear()
            cpu["regional"].clear()
    rate = {k: [rows / t for t in v] for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in rate.items()}
    ratio = med["regional"] / med["stock"]
    return [Row(f"1. fault-free throughput at volume: 16 regions, {rows:,} lines ({size_mb:,.0f} MB), text -> Delta",
                "rows/s (min/median/max)", spread(rate["stock"]), spread(rate["regional"]), f"{ratio:.2f}x",
                ">= 0.9x stock", "yes" if ratio >= 0.9 else "no",
                [f"the limit, pyarrow alone on the same bytes: {med['pyarrow']:,.0f} rows/s; regional at "
                 f"{med['regional'] / med['pyarrow']:.2f}x of it, stock at {med['stock'] / med['pyarrow']:.2f}x",
                 f"{epochs} epochs (batches) of {files_per_batch} files each; the first pair of runs warms up and is "
                 "not counted",
                 f"memory during the last runs: regional {footprints['regional'].describe()}; stock "
                 f"{footprints['stock'].describe()}",
                 "CPU seconds per million rows (median over the counted runs, from /proc): "
                 + "; ".join(f"{name}: {cpu_per_million(runs, rows)}" for name, runs in cpu.items())
                 + " (pyarrow alone is one thread; Spark has 2 cores)"])]

