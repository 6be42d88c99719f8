"""``python -m regional status`` and ``timeline`` on a real store, without Spark."""

import json
import subprocess
import sys
import time

from regional.cli.status import render
from regional.cli.timeline import COMMITTED, CUT, FALLEN_BACK, IDLE, MAX_ROWS, QUARANTINED, WAITING, outcome_grid
from regional.store import EpochKind, EpochRecord, FallBack, RegionState, Slice, Standing, Store
from regional.store.status import status
from support import write_store_file


def a_store(tmp_path, now):
    store = Store(tmp_path)
    store.open_query()
    store.write_record(EpochRecord(0, EpochKind.GLOBAL, {"a/b": Slice(0, 5, 5), "c": Slice(0, 5, 5)}, {},
                                   {"a/b": RegionState(5, 0), "c": RegionState(5, 0)}, recorded_at=now - 300))
    store.write_record(EpochRecord(
        1, EpochKind.REGIONAL, {"a/b": Slice(5, 9, 4, cut=True)}, {"c": FallBack(0, "ConnectionError: down")},
        {"a/b": RegionState(9, 1), "c": RegionState(5, 0, 1, Standing.FALLEN_BACK, "ConnectionError: down"),
         "q": RegionState(0, None, 1, Standing.QUARANTINED, "ValueError: poison")},
        regional_epochs=1, recorded_at=now - 10))
    store.record_latest_offsets(2, {"a/b": 12, "c": 20, "q": 7})
    return store


def run(*args):
    return subprocess.run([sys.executable, "-m", "regional", *args], capture_output=True, text=True)


def test_status_shows_lag_and_the_age_of_each_ref_epoch(tmp_path):
    a_store(tmp_path, time.time())
    result = run("status", str(tmp_path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "3 regions (2 behind), epoch 1, 1 regional epochs, oldest ref_epoch -1, max lag 15" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:5]}
    assert rows["c"][:6] == ["c", "5", "20", "15", "0", "1e/5m"] and rows["c"][7] == "fallen_back"
    assert rows["a/b"][:5] == ["a/b", "9", "12", "3", "-"]
    assert rows["q"][4] == "-1" and rows["q"][5].startswith("2e/") and "quarantined" in rows["q"][7]
    assert "epoch 1: regional; committed 1 [a/b]; fallen back 1 [c(ref_epoch=0)]" in out


def test_status_json_has_regions_and_epochs(tmp_path):
    a_store(tmp_path, time.time())
    data = json.loads(run("status", str(tmp_path), "--json").stdout)
    c = data["regions"]["c"]
    assert {k: c[k] for k in ("state", "committed_offset", "latest_offset", "lag", "ref_epoch", "ref_age_epochs",
                              "consecutive_failures", "reason")} == {
        "state": "fallen_back", "committed_offset": 5, "latest_offset": 20, "lag": 15, "ref_epoch": 0,
        "ref_age_epochs": 1, "consecutive_failures": 1, "reason": "ConnectionError: down"}
    assert 295 < c["ref_age_seconds"] < 400
    assert [e["epoch"] for e in data["epochs"]] == [0, 1] and data["epochs"][1]["committed"]["a/b"]["cut"]
    assert [e["epoch"] for e in json.loads(run("status", str(tmp_path), "--json", "--epochs", "1").stdout)
            ["epochs"]] == [1]


def test_status_on_a_corrupt_store_says_so_and_fails(tmp_path):
    (tmp_path / "regional" / "epochs").mkdir(parents=True)
    (tmp_path / "regional" / "epochs" / "000000000000.json").write_text("regional epoch v1 sha256=00\n{not json")
    result = run("status", str(tmp_path))
    assert result.returncode == 1 and "corrupt" in result.stderr and "000000000000.json" in result.stderr


def test_status_of_a_thousand_regions_reads_only_what_it_shows(tmp_path):
    store = Store(tmp_path)
    regions = {f"r{i:04d}": RegionState(10 * e, e) for i in range(1000) for e in (0,)}
    for e in range(30):
        regions = {r: RegionState(10 * (e + 1), e) for r in regions}
        store.write_record(EpochRecord(e, EpochKind.GLOBAL, {}, {}, regions, recorded_at=float(e)))
    write_store_file(tmp_path / "regional" / "epochs" / "000000000003.json", "epoch", {"damaged": True})
    st = status(tmp_path, epochs=5)  # record 3 is neither shown nor referenced: never read
    assert [e.epoch for e in st.epochs] == [25, 26, 27, 28, 29] and len(st.regions) == 1000


def test_the_timeline_grid_and_picture(tmp_path):
    a_store(tmp_path, time.time())
    labels, epochs, cells, lags, shares, per_row = outcome_grid(status(tmp_path))
    assert labels == ["a/b", "c", "q"] and epochs == [0, 1]
    # q, quarantined and behind, is planned in neither epoch: waiting, not "no work" (issue 58)
    assert cells == [[COMMITTED, CUT], [COMMITTED, FALLEN_BACK], [IDLE, WAITING]] and lags == [3, 15, 7]
    assert shares == [[1.0, 1.0]] * 3 and per_row == 1
    out = tmp_path / "timeline.png"
    result = run("timeline", str(tmp_path), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_the_timeline_aggregates_many_regions(tmp_path):
    store = Store(tmp_path)
    regions = {f"r{i:04d}": RegionState(1, 0) for i in range(1000)}
    regions["r0500"] = RegionState(0, None, 1, Standing.QUARANTINED, "poison")
    store.write_record(EpochRecord(0, EpochKind.REGIONAL, {"r0001": Slice(0, 1, 1)},
                                   {"r0500": FallBack(-1, "poison", True)}, regions))
    grid = outcome_grid(status(tmp_path))
    assert len(grid.labels) <= MAX_ROWS and grid.labels[0].startswith("r0000 .. ")
    assert sum(row[0] == QUARANTINED for row in grid.cells) == 1 and grid.cells[0][0] == COMMITTED
    size = -(-1000 // MAX_ROWS)
    assert grid.per_row == size
    row = next(i for i, cells in enumerate(grid.cells) if cells[0] == QUARANTINED)
    assert grid.shares[row][0] == 1 / size and grid.shares[0][0] == 1 / size  # one of the row's regions each
    result = run("timeline", str(tmp_path), "-o", str(tmp_path / "many.png"))
    assert result.returncode == 0, result.stderr


def test_status_and_timeline_show_dead_letters_and_isolating_ranges(tmp_path):
    from regional.cli.timeline import DEAD_LETTERED
    from regional.store import DeadLetter

    store = Store(tmp_path)
    store.open_query()
    store.write_record(EpochRecord(0, EpochKind.REGIONAL, {"a": Slice(0, 30, 30)}, {"p": FallBack(-1, "q", True)},
                                   {"a": RegionState(30, 0), "p": RegionState(0, None, 0, Standing.QUARANTINED, "q",
                                                                              isolating=(0, 30))}))
    store.write_record(EpochRecord(1, EpochKind.GLOBAL, {}, {}, {"a": RegionState(30, 0),
                                                                 "p": RegionState(8, 1, dead_letters=1)},
                                   dead_lettered={"p": DeadLetter(7, "ValueError: bad")}))
    st = status(tmp_path)
    assert st.regions["p"].dead_letters == 1 and st.progress().dead_letters == 1
    assert "p: offset 7 dead-lettered: ValueError: bad" in render(st)
    assert "dead-lettered 1 [p@7]" in render(st)
    shown = json.loads(run("status", str(tmp_path), "--json").stdout)
    assert shown["regions"]["p"]["dead_letters"] == 1
    assert shown["epochs"][1]["dead_lettered"] == {"p": {"offset": 7, "error": "ValueError: bad", "records": 1}}
    assert outcome_grid(st).cells == [[COMMITTED, IDLE], [QUARANTINED, DEAD_LETTERED]]
    first = status(tmp_path, epochs=None)
    assert first.epochs[0].regions["p"].isolating == (0, 30)


def test_status_shows_a_stragglers_range_limit(tmp_path):
    store = Store(tmp_path)
    store.open_query()
    store.write_record(EpochRecord(0, EpochKind.GLOBAL, {"a": Slice(0, 30, 30), "s": Slice(0, 30, 30)}, {},
                                   {"a": RegionState(30, 0), "s": RegionState(30, 0, timed_range=125)}))
    st = status(tmp_path)
    line = next(line for line in render(st).splitlines() if line.strip().startswith("s "))
    assert "straggler: ranges of at most 125 offsets (regionTimeout)" in line
    shown = json.loads(run("status", str(tmp_path), "--json").stdout)
    assert shown["regions"]["s"]["timed_range"] == 125 and shown["regions"]["a"]["timed_range"] is None


def test_the_status_snapshot_for_the_spark_ui_and_metrics(tmp_path):
    """``status.json`` (written by the driver after recorded epochs): the metrics' figures, every region's row,
    compact epochs; it round-trips through the store's file format, and the timeline SVG escapes region ids."""
    import xml.etree.ElementTree as ElementTree

    from regional.cli.timeline import svg
    from regional.spark.status_publisher import write_snapshot
    from regional.store.status import snapshot

    now = time.time()
    store = a_store(tmp_path, now)
    evil = '<script>alert("x")</script>&'
    store.write_record(EpochRecord(
        2, EpochKind.REGIONAL, {evil: Slice(0, 1, 1)}, {"c": FallBack(0, "ConnectionError: down")},
        {"a/b": RegionState(9, 1), "c": RegionState(5, 0, 2, Standing.FALLEN_BACK, "ConnectionError: down"),
         "q": RegionState(0, None, 1, Standing.QUARANTINED, "ValueError: poison"), evil: RegionState(1, None)},
        regional_epochs=2, recorded_at=now - 1))
    st = status(tmp_path, 20)
    data = snapshot(st, svg(st))
    m = data["metrics"]
    assert (m["epoch"], m["regions"], m["fallen_back"], m["quarantined"], m["regions_with_work"]) == (2, 4, 1, 1, 2)
    assert m["oldest_ref_age_epochs"] == 3 and m["lag"] == 3 + 15 + 7 and m["epochs_total"] == 3
    assert m["recent_epochs"] == {"global": 1, "regional": 2, "forced_global": 0, "aborted": 0}
    assert 290 < m["oldest_ref_age_seconds"] < 400  # c's ref_epoch 0 was recorded 300 s ago; q's -1 has no time
    assert data["regions"]["c"]["ref_epoch"] == 0 and data["regions"][evil]["state"] == "ok"
    assert data["epochs"][-1]["fallen_back_regions"] == {"c": "ConnectionError: down"}
    picture = ElementTree.fromstring(data["timeline_svg"])  # well-formed: the id is text, not markup
    assert evil[:36] in "".join(picture.itertext()) and "<script>" not in data["timeline_svg"]
    write_snapshot(str(tmp_path))
    assert Store(tmp_path).read_status()["metrics"]["epoch"] == 2


def test_status_and_timeline_refuse_a_path_that_is_not_a_regional_checkpoint(tmp_path):
    """A missing path, a file, Spark's checkpoint of a query that does not write with regional, the store directory
    given for its checkpoint: one line from regional saying what to do, no traceback, a non-zero exit; never an
    empty status that reads like a query with no regions."""
    (tmp_path / "a-file").write_text("x")
    spark_only = tmp_path / "spark-only"
    (spark_only / "offsets").mkdir(parents=True)
    (spark_only / "metadata").write_text('{"id":"x"}')
    regional_store = tmp_path / "ck"
    Store(regional_store).open_query()
    cases = {tmp_path / "missing": "does not exist", tmp_path / "a-file": "is a file, not a directory",
             spark_only: "is not a regional checkpoint", regional_store / "regional": f"give the checkpoint, "
                                                                                      f"{regional_store}"}
    for path, says in cases.items():
        for command in (["status"], ["status", "--json"], ["timeline", "-o", str(tmp_path / "t.png")]):
            result = run(*command, str(path))
            assert result.returncode == 1, (command, path, result.stdout)
            assert result.stdout == "" and "Traceback" not in result.stderr, (command, path, result.stderr)
            line, = result.stderr.splitlines()
            assert line.startswith(f"regional: {path} ") and says in line, (command, line)
    assert not (tmp_path / "t.png").exists()
    started = run("status", str(regional_store))  # a regional query before its first epoch: a status, exit 0
    assert started.returncode == 0 and "a regional query with no epoch decided yet" in started.stdout, started.stderr
    drawn = run("timeline", str(regional_store), "-o", str(tmp_path / "t.png"))  # nothing to draw yet: says so
    assert drawn.returncode == 1 and drawn.stderr.startswith(f"regional: {regional_store} has no epoch records yet")
    assert len(drawn.stderr.splitlines()) == 1 and "once its query has decided an epoch" in drawn.stderr
