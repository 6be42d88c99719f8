"""SIGKILL the whole query (driver, JVM, Python workers) inside phase two, then restart.

The fail-points are reached through REGIONAL_FAILPOINT, which only tests set:
the process that reaches one writes a marker file and waits to be killed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

import regional
from integration.helpers import add_epoch_of_files, assert_exactly_once_in_order, expected_rows, run_killable
from regional.targets.delta import STAGING_DIR


def run_child(inp: Path, out: Path, ck: Path, b_down: Path, failpoint: str | None, marker: Path,
              timeout: float = 240) -> str:
    return run_killable(["integration.crash_child", str(inp), str(out), str(ck), str(b_down)], failpoint, marker,
                        timeout)


def orphans(table: Path) -> list[str]:
    """Staged files left behind, and parquet files in the table directory that the Delta log does not add."""
    staged = [str(p) for p in (table / STAGING_DIR).rglob("*.parquet")]
    in_log = {Path(uri).name for uri in DeltaTable(str(table)).file_uris()}
    return staged + [p.name for p in table.glob("*.parquet") if p.name not in in_log]


# The campaign (REGIONAL_CAMPAIGN=1, reliability.run): in a task, after the decision, before the record. CI keeps
# within its time with the kills it runs elsewhere: a random kill (test_random_kills), PostgreSQL between two
# COMMIT PREPARED, the dead-letter kills, and Python workers killed in a task (test_postgres_target).
@pytest.mark.campaign
@pytest.mark.parametrize("failpoint", ["staged:1", "before_publish:1", "before_record:1"])
def test_sigkill_inside_phase_two_then_restart_publishes_everything_once(tmp_path, failpoint):
    inp, out, ck, marker = tmp_path / "in", tmp_path / "out", tmp_path / "ck", tmp_path / "reached"
    b_down = tmp_path / "b_down"
    inputs = add_epoch_of_files(inp, ["a", "b", "c"], "001", 10)

    # First run: b's target is down; the run is killed inside epoch 1's phase two.
    b_down.touch()
    assert run_child(inp, out, ck, b_down, failpoint, marker) == "killed"
    store = regional.status(ck)
    assert [e.epoch for e in store.epochs] == [0]  # epoch 1 was never recorded
    decided = (ck / "regional" / "intents" / "000000000001.json").exists()
    assert decided == (failpoint != "staged:1")  # a kill in a task comes before the decision

    # The restart re-runs epoch 1, and this time b's tasks succeed: the epoch must still be
    # finished as first decided (b fell back), or the store would claim rows the table lacks.
    b_down.unlink()
    assert run_child(inp, out, ck, b_down, None, marker) == "finished"
    epochs = regional.status(ck).epochs
    if decided:
        assert epochs[1].kind == "regional" and set(epochs[1].fallen_back) == {"b"}
    assert_exactly_once_in_order(out, expected_rows(inputs))
    # Files of the killed run that will never be published are not in the table's log (readers never see
    # them). Those of decided slices are deleted by name; those of task attempts killed before the decision are
    # left to Delta's VACUUM, as delta-spark leaves its own: after one, nothing is left and nothing is lost.
    assert run_child(inp, out, ck, b_down, None, marker) == "finished"
    if decided:
        assert orphans(out) == []
    DeltaTable(str(out)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True)
    assert orphans(out) == []
    assert_exactly_once_in_order(out, expected_rows(inputs))


def test_a_query_whose_checkpoint_another_process_holds_fails_then_runs_once_it_is_gone(spark, dirs):
    """The fast variant (the campaign runs two real drivers, below): a live process holds the store's driver lock."""
    import subprocess
    import sys

    from integration.helpers import error_of, regional_stream, start_to_delta

    inp, out, ck = dirs
    inputs = add_epoch_of_files(inp, ["a", "b"], "001", 6)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from regional.store import Store; "
                               "Store(sys.argv[1]).fence(); print('held', flush=True); time.sleep(600)", str(ck)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        error = error_of(lambda: start_to_delta(regional_stream(spark, inp, ck), out, ck))
        assert f"another driver is running the query of {ck} (process {holder.pid} on" in error, error
        assert not out.exists()  # nothing planned, nothing published
    finally:
        holder.kill()
        holder.wait()
    query = start_to_delta(regional_stream(spark, inp, ck), out, ck)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert_exactly_once_in_order(out, expected_rows(inputs))


@pytest.mark.campaign
def test_a_second_driver_on_the_same_checkpoint_is_fenced_out_and_the_first_goes_on(spark, tmp_path):
    """Two drivers on one checkpoint would both decide and publish the same epochs. The first holds the store's
    driver lock while it runs; the second fails, saying so, before it plans or runs anything."""
    from integration.helpers import child_driver, error_of, regional_stream, start_to_delta, wait_for_child_epochs

    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    inputs = add_epoch_of_files(inp, ["a", "b", "c"], "001", 200)  # 50 epochs at 4 records per region
    with child_driver(["integration.crash_child", str(inp), str(out), str(ck), str(tmp_path / "never")]) as first:
        wait_for_child_epochs(first, ck, 1)
        error = error_of(lambda: start_to_delta(regional_stream(spark, inp, ck, maxRecordsPerRegion="4"), out, ck))
        assert "another driver is running the query" in error and "process" in error, error
        assert first.poll() is None, "the first driver ended before the second was fenced out: nothing was tested"
    assert_exactly_once_in_order(out, expected_rows(inputs))
