"""Scenario 5: transient failures of 5% of region-epochs; the work redone per committed row, regional against
stock Spark restarted by a supervisor that heals each failed batch."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import regional
from benchmarks.common import REGIONS, Mode, Row, delta_rows, regional_query, spread, stock_query, timed
from benchmarks.faults import transient_failure


def run(spark, work: Path, mode: Mode, inp: Path, rows: int) -> list[Row]:
    from pyspark.sql import functions as F

    share = 0.05
    epochs = 8
    per_epoch = mode.rows_per_file * mode.files_per_region // epochs
    reg_extra, stock_extra, reg_failed_share, stock_failed_share, reg_wasted_share = [], [], [], [], []
    for i in range(mode.repeats):
        d = work / f"transient-{i}"
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

            context = TaskContext.get()
            assert context is not None  # a UDF runs in a task
            batch = int(context.getLocalProperty("streaming.sql.batchId") or -1)
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
    return [Row("5. transient failures, 5% of region-epochs", "extra rows processed per row committed",
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
