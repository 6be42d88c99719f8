"""The outage benchmark measures from the Delta log: when each second's records were all in the table, and the rows
per region each commit added. A watcher that miscounts would report a recovery that never happened."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's benchmarks/, not installed
from benchmarks.dead_letters import bound
from benchmarks.outage import PAD, TableWatcher


def lines(region: str, tick: int, first: int, last: int) -> list[str]:
    return [f"{region} {tick:06d} {i:06d} {PAD}".upper() for i in range(first, last)]


def commit_times(table: Path) -> list[float]:
    times = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in entry.read_text().splitlines() if line.strip()]
        times.append(next(a["commitInfo"]["timestamp"] for a in actions if "commitInfo" in a) / 1000.0)
    return times


def test_a_second_is_complete_only_when_every_line_of_every_region_landed(tmp_path):
    table = tmp_path / "t"
    watcher = TableWatcher(table, rate=3)
    watcher.poll()  # no table yet: nothing, no error
    assert watcher.commits == [] and watcher.current_at(["r00"], 0) is None
    write_deltalake(str(table), pa.table({"value": lines("r00", 0, 0, 3) + lines("r01", 0, 0, 2)}))
    watcher.poll()
    assert watcher.current_at(["r00"], 0) is not None
    assert watcher.current_at(["r00", "r01"], 0) is None  # r01's tick 0 lacks a line
    write_deltalake(str(table), pa.table({"value": lines("r01", 0, 2, 3) + lines("r00", 1, 0, 3)}), mode="append")
    watcher.poll()
    first, second = commit_times(table)
    assert watcher.current_at(["r00", "r01"], 0) == second
    assert watcher.current_at(["r00"], 1) == second
    assert watcher.current_at(["r00", "r01"], 1) is None
    assert watcher.rows_until({"r01"}, first) == 2 and watcher.rows_until({"r01"}, second) == 3
    assert watcher.rows_until({"r00", "r01"}, second) == 9


def test_the_documented_bound_on_a_poison_record():
    # docs/design.md: 1 + ceil(log2 n) epochs to isolate, then 2 x (retries + 1) + 1 alone; the retries' waits.
    assert bound(20_000, 4, 60.0) == (1 + 15 + 11, 250.0)
    assert bound(20_000, 0, 0.0) == (1 + 15 + 3, 3.0)
