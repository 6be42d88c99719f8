"""Scenario 2: one of 16 regions' target down for a window; the healthy regions' committed rows/s against
fault-free, and stock Spark restarted by a supervisor loop."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from benchmarks.common import (
    FAILING,
    REGIONS,
    Mode,
    Row,
    Sampler,
    delta_rows,
    regional_query,
    spread,
    stock_query,
    wait_until,
)
from regional.store import Store


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
        wait_until(lambda: healthy_committed(d / "ck") > 0, 300)
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
        wait_until(lambda: delta_rows(d / "out") > 0, 300)
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


def run(spark, work: Path, mode: Mode, inp: Path, png: Path) -> list[Row]:
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
    # A rate over a window in which the input ran out is diluted by the idle rest: say whether it lasted.
    healthy_input = (len(REGIONS) - 1) * mode.rows_per_file * mode.files_per_region
    lasted = all(s.count_at(s.window[1]) < healthy_input for s in (base, faulty))
    reg_ratio = statistics.median(reg_fail) / statistics.median(reg_free)
    stock_ratio = statistics.median(stock_fail) / max(statistics.median(stock_free), 1e-9)
    if plot is not None:
        draw_scenario_2(plot[0], plot[1], png)
    return [Row(f"2. one of 16 regions failing for {mode.window_s:.0f}s", "healthy regions' committed rows/s "
                "in the window, as a share of fault-free", f"{stock_ratio:.2f}", f"{reg_ratio:.2f}",
                f"{reg_ratio:.2f}x", ">= 0.9x fault-free", "yes" if reg_ratio >= 0.9 else "no",
                [f"healthy rows/s fault-free / in the window: regional {spread(reg_free)} / {spread(reg_fail)}, "
                 f"stock {spread(stock_free)} / {spread(stock_fail)} (stock restarted {spread(restarts)} times "
                 "by the supervisor loop)",
                 f"the healthy regions' input ({healthy_input:,} lines) lasted the whole window in the last regional "
                 f"runs: {'yes' if lasted else 'NO (the rates are diluted)'}"])]


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
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
