"""source=files: one record per line, as Spark's text source reads them; offsets count lines across a region's
files in arrival order, kept in a manifest in the regional store, so no name, deletion or rename shifts them."""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest

from regional.errors import RegionalConfigError, RegionalDataLossError, RegionalStoreError
from regional.inputs import files
from regional.inputs.files import lines as files_lines
from regional.inputs.files import local as files_local
from regional.store import EpochKind, EpochRecord, RegionState, Store
from regional.store import source_log as source_log_module


def test_lines_end_with_newline_or_carriage_return_newline_and_offsets_count_lines(tmp_path):
    region = tmp_path / "r-ü"
    region.mkdir()
    (region / "0001.txt").write_bytes(b"a\r\nb\n\r\nc")  # CRLF, LF, an empty line, no final newline
    (region / "0002.txt").write_bytes(b"d\ne\n")
    (region / ".0003.txt").write_bytes(b"hidden: still being written\n")
    source = files.create({"path": str(tmp_path)})
    assert source.available(0) == {"r-ü": 6}
    batches = list(source.read("r-ü", 1, 6, source.split("r-ü", 1, 6), batch_rows=2))
    rows = [row for batch in batches for row in batch.to_pylist()]
    assert rows == [{"region": "r-ü", "offset": o, "value": v} for o, v in [(1, "b"), (2, ""), (3, "c"), (4, "d"),
                                                                           (5, "e")]]
    assert all(batch.schema == files.SCHEMA and batch.num_rows <= 2 for batch in batches)


# -- helpers: a real input directory and a real store -----------------------------------------------------


@pytest.fixture
def inp(tmp_path):
    return tmp_path / "in"


@pytest.fixture
def ck(tmp_path):
    return tmp_path / "ck"


def put(inp, region, name, values):
    """A file the way writers must add it: hidden name, then rename."""
    directory = inp / region
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_text("".join(v + "\n" for v in values))
    os.replace(tmp, directory / name)


def source(inp, ck, path=None):
    """The input as the reader builds it on a (re)started driver."""
    s = files.create({"path": str(path or inp)})
    s.use_store(Store(ck))
    return s


def commit(ck, epoch, committed):
    """An epoch record, as the sink's commit writes it: each region's committed offset."""
    Store(ck).write_record(EpochRecord(epoch, EpochKind.GLOBAL, {}, {},
                                       {r: RegionState(o, epoch) for r, o in committed.items()}))


def read_all(s, region, start, end):
    return [(row["offset"], row["value"]) for b in s.read(region, start, end, s.split(region, start, end))
            for row in b.to_pylist()]


def values(prefix, n):
    return [f"{prefix}-{i}" for i in range(n)]


# -- arrival order ---------------------------------------------------------------------------------------------


def test_a_file_whose_name_sorts_first_but_arrives_last_gets_the_offsets_after_every_known_file(inp, ck):
    for i in range(1, 10):
        put(inp, "a", f"part-{i}", values(f"p{i}", 10))
    s = source(inp, ck)
    assert s.available(0) == {"a": 90}
    first = read_all(s, "a", 0, 90)
    assert [v for _o, v in first] == [v for i in range(1, 10) for v in values(f"p{i}", 10)]
    commit(ck, 0, {"a": 90})
    put(inp, "a", "part-10", values("p10", 10))  # sorts before part-2
    assert s.available(1) == {"a": 100}
    assert read_all(s, "a", 90, 100) == list(zip(range(90, 100), values("p10", 10), strict=True))
    assert read_all(s, "a", 0, 90) == first  # nothing before it moved


def test_files_first_seen_in_one_listing_are_ordered_by_name_then_later_ones_come_after(inp, ck):
    put(inp, "a", "b.txt", ["b"])
    put(inp, "a", "a.txt", ["a"])
    s = source(inp, ck)
    assert s.available(0) == {"a": 2}
    put(inp, "a", "0.txt", ["zero"])
    put(inp, "a", "c.txt", ["c"])
    assert s.available(1) == {"a": 4}
    assert [v for _o, v in read_all(s, "a", 0, 4)] == ["a", "b", "zero", "c"]


def test_the_manifest_survives_a_restart_and_a_crash_before_the_plan_was_logged(inp, ck):
    put(inp, "a", "2", ["two"])
    put(inp, "b", "x", ["x0", "x1"])
    first = source(inp, ck)
    assert first.available(0) == {"a": 1, "b": 2}
    put(inp, "a", "10", ["ten"])
    assert first.available(1) == {"a": 2, "b": 2}  # written to the store; then the driver dies, no plan logged
    restarted = source(inp, ck)
    assert restarted.available(1) == {"a": 2, "b": 2}  # the same offsets, though "10" sorts before "2"
    assert read_all(restarted, "a", 0, 2) == [(0, "two"), (1, "ten")]
    put(inp, "a", "1", ["one"])
    assert restarted.available(2) == {"a": 3}  | {"b": 2}
    assert read_all(source(inp, ck), "a", 2, 3) == [(2, "one")]  # a re-run plan: split made from the store


def test_a_plan_re_run_after_a_restart_splits_from_the_stored_manifest_before_any_listing(inp, ck):
    put(inp, "a", "9", values("nine", 3))
    s = source(inp, ck)
    s.available(0)
    put(inp, "a", "10", values("ten", 2))
    s.available(1)
    restarted = source(inp, ck)  # Spark re-runs the logged plan: partitions() before any latestOffset
    assert read_all(restarted, "a", 3, 5) == [(3, "ten-0"), (4, "ten-1")]


# -- deletions -------------------------------------------------------------------------------------------------


def test_a_processed_file_deleted_shifts_nothing_and_is_dropped_from_the_manifest(inp, ck):
    put(inp, "a", "1", values("one", 3))
    put(inp, "a", "2", values("two", 3))
    s = source(inp, ck)
    assert s.available(0) == {"a": 6}
    commit(ck, 0, {"a": 6})
    (inp / "a" / "1").unlink()
    put(inp, "a", "3", values("three", 2))
    assert s.available(1) == {"a": 8}
    assert read_all(s, "a", 6, 8) == [(6, "three-0"), (7, "three-1")]
    assert s.available(2) == {"a": 8}  # the second listing that misses it drops it
    assert sorted(f.name for f in s.manifest()["a"].files.values()) == ["2", "3"]
    assert sorted(f.name for f in source(inp, ck).manifest()["a"].files.values()) == ["2", "3"]


def test_a_file_deleted_before_its_lines_were_published_fails_naming_it_and_the_offsets(inp, ck):
    put(inp, "a", "1", values("one", 3))
    put(inp, "a", "2", values("two", 4))
    s = source(inp, ck)
    s.available(0)
    commit(ck, 0, {"a": 4})  # one line of "2" published
    (inp / "a" / "2").unlink()
    with pytest.raises(RegionalDataLossError, match=r"offsets \[4, 7\) of region 'a' .* planned but not "
                                                    r"published.*'2', which is gone"):
        s.split("a", 4, 7)
    s.available(1)  # the first listing that misses it marks it
    with pytest.raises(RegionalDataLossError, match=r"file '2' of region 'a' .* deleted with offsets \[4, 7\) "
                                                    r"not yet published"):
        source(inp, ck).available(2)
    put(inp, "a", "2", values("two", 4))  # put back: same name, same content
    assert source(inp, ck).available(3) == {"a": 7}
    assert read_all(source(inp, ck), "a", 4, 7) == [(4, "two-1"), (5, "two-2"), (6, "two-3")]


def test_a_re_run_of_a_recorded_epoch_does_not_need_files_deleted_after_it(inp, ck):
    put(inp, "a", "1", values("one", 3))
    s = source(inp, ck)
    s.available(0)
    commit(ck, 0, {"a": 3})  # recorded; Spark died before its commits/0
    (inp / "a" / "1").unlink()
    restarted = source(inp, ck)
    assert restarted.split("a", 0, 3) == []  # its output is discarded by the sink: nothing to read


def test_a_task_whose_planned_file_is_gone_fails_naming_it(inp, ck):
    put(inp, "a", "1", values("one", 3))
    s = source(inp, ck)
    s.available(0)
    split = s.split("a", 0, 3)
    (inp / "a" / "1").unlink()
    task = pickle.loads(pickle.dumps(s))
    with pytest.raises(RegionalDataLossError, match=r"file '1' of region 'a' \(offsets \[0, 3\)\) is gone"):
        list(task.read("a", 0, 3, split))


def test_a_removed_region_directory_with_unpublished_records_fails_naming_it_and_the_offsets(inp, ck):
    put(inp, "a", "1", values("one", 5))
    put(inp, "b", "1", values("b", 2))
    s = source(inp, ck)
    s.available(0)
    commit(ck, 0, {"a": 2, "b": 2})
    shutil.rmtree(inp / "a")
    with pytest.raises(RegionalDataLossError, match=r"region directory 'a' .* removed with offsets \[2, 5\) not "
                                                    "yet published"):
        s.available(1)
    with pytest.raises(RegionalDataLossError, match="region directory 'a'"):
        source(inp, ck).available(1)


def test_a_removed_region_directory_whose_records_were_all_published_may_go_and_come_back(inp, ck):
    put(inp, "a", "1", values("one", 5))
    s = source(inp, ck)
    s.available(0)
    commit(ck, 0, {"a": 5})
    shutil.rmtree(inp / "a")
    assert s.available(1) == {}
    assert s.available(2) == {}
    put(inp, "a", "1", values("again", 2))  # the same name, new content: a new file of the region
    assert source(inp, ck).available(3) == {"a": 7}
    assert read_all(source(inp, ck), "a", 5, 7) == [(5, "again-0"), (6, "again-1")]


def test_a_region_directory_renamed_is_refused_rather_than_read_again(inp, ck):
    put(inp, "a", "1", values("one", 3))
    s = source(inp, ck)
    s.available(0)
    commit(ck, 0, {"a": 3})
    os.rename(inp / "a", inp / "b")
    with pytest.raises(RegionalConfigError, match=r"region directory 'b' .* holds '1', the file '1' of region 'a', "
                                                  r"whose directory is gone: was 'a' renamed to 'b'\?"):
        s.available(1)
    os.rename(inp / "b", inp / "a")
    assert s.available(1) == {"a": 3}


# -- renames ---------------------------------------------------------------------------------------------------


def test_a_renamed_file_is_recognised_and_not_read_twice(inp, ck):
    put(inp, "a", "part-1", values("one", 3))
    put(inp, "a", "part-2", values("two", 3))
    s = source(inp, ck)
    s.available(0)
    commit(ck, 0, {"a": 3})
    os.rename(inp / "a" / "part-1", inp / "a" / "done-1")  # processed
    split = s.split("a", 3, 6)
    os.rename(inp / "a" / "part-2", inp / "a" / "z-2")  # planned, not yet read: the task finds it
    assert [(r["offset"], r["value"]) for b in s.read("a", 3, 6, split) for r in b.to_pylist()] == \
        list(zip(range(3, 6), values("two", 3), strict=True))
    assert s.available(1) == {"a": 6}
    assert source(inp, ck).available(2) == {"a": 6}
    assert sorted(f.name for f in source(inp, ck).manifest()["a"].files.values()) == ["done-1", "z-2"]
    assert read_all(s, "a", 3, 6) == list(zip(range(3, 6), values("two", 3), strict=True))


def test_rotated_logs_are_renames_and_the_new_current_file_is_new(inp, ck):
    """logrotate's scheme: app.log.2 deleted, .1 -> .2, app.log -> .1, a new app.log (written hidden, renamed)."""
    put(inp, "a", "app.log", values("first", 2))
    s = source(inp, ck)
    s.available(0)
    commit(ck, 0, {"a": 2})
    for rotation in ("second", "third", "fourth"):
        d = inp / "a"
        (d / "app.log.2").unlink(missing_ok=True)
        if (d / "app.log.1").exists():
            os.rename(d / "app.log.1", d / "app.log.2")
        os.rename(d / "app.log", d / "app.log.1")
        put(inp, "a", "app.log", values(rotation, 2))
        end = s.available(1)["a"]
        assert read_all(s, "a", end - 2, end) == list(zip(range(end - 2, end), values(rotation, 2), strict=True))
        commit(ck, 1, {"a": end})
    assert end == 8


def test_a_hard_link_is_the_same_file_and_a_copy_is_a_new_one(inp, ck):
    put(inp, "a", "1", values("one", 3))
    s = source(inp, ck)
    s.available(0)
    os.link(inp / "a" / "1", inp / "a" / "1-link")
    assert s.available(1) == {"a": 3}
    shutil.copy(inp / "a" / "1", inp / "a" / "1-copy")  # documented: a copy is new, even with equal content
    assert s.available(2) == {"a": 6}


def test_a_processed_file_renamed_and_appended_to_fails_naming_it(inp, ck):
    put(inp, "a", "1", values("one", 3))
    s = source(inp, ck)
    s.available(0)
    commit(ck, 0, {"a": 3})
    os.rename(inp / "a" / "1", inp / "a" / "2")
    with open(inp / "a" / "2", "a") as f:
        f.write("late\n")
    with pytest.raises(RegionalConfigError, match=r"file '1' of region 'a' changed .*renamed to '2' and appended"):
        s.available(1)


# -- changes ---------------------------------------------------------------------------------------------------


def test_a_file_changed_while_the_query_is_stopped_fails_the_restart_naming_it(inp, ck):
    put(inp, "a", "1", values("one", 3))
    put(inp, "a", "2", values("two", 3))
    source(inp, ck).available(0)
    with open(inp / "a" / "1", "a") as f:
        f.write("late\n")
    with pytest.raises(RegionalConfigError, match=r"file '1' of region 'a' changed after its lines were counted "
                                                  r"\(\d+ bytes when first seen, \d+ now\)"):
        source(inp, ck).available(1)


def test_same_size_other_content_fails_and_a_touch_or_byte_equal_copy_does_not(inp, ck):
    put(inp, "a", "1", ["abc"])
    source(inp, ck).available(0)
    os.utime(inp / "a" / "1", ns=(1, 1))  # touched
    assert source(inp, ck).available(1) == {"a": 1}
    put(inp, "a", "1", ["abc"])  # replaced by a byte-equal file
    assert source(inp, ck).available(2) == {"a": 1}
    put(inp, "a", "1", ["abd"])  # replaced by another file of the same size
    with pytest.raises(RegionalConfigError, match=r"file '1' of region 'a' changed .*same size, other content"):
        source(inp, ck).available(3)


def test_a_task_reading_a_file_changed_after_planning_fails_naming_it(inp, ck):
    put(inp, "a", "1", ["abc"])
    s = source(inp, ck)
    s.available(0)
    split = s.split("a", 0, 1)
    with open(inp / "a" / "1", "r+") as f:
        f.write("xyz")
    os.utime(inp / "a" / "1", ns=(5, 5))
    with pytest.raises(RegionalConfigError, match=r"file '1' of region 'a' changed .*when a task read it"):
        list(pickle.loads(pickle.dumps(s)).read("a", 0, 1, split))


# -- the path, the store ---------------------------------------------------------------------------------------


def test_another_path_on_the_same_checkpoint_is_refused_naming_both(inp, ck, tmp_path):
    put(inp, "a", "1", values("one", 3))
    source(inp, ck).available(0)
    other = tmp_path / "other"
    put(other, "a", "1", values("one", 3))
    with pytest.raises(RegionalConfigError) as err:
        source(inp, ck, path=other).available(1)
    assert f"path is now {other}" in str(err.value) and f"read path {inp}" in str(err.value)
    with pytest.raises(RegionalConfigError, match="path is now"):
        source(inp, ck, path=other).split("a", 0, 3)  # a re-run of a logged plan is refused too


def test_a_checkpoint_from_before_the_manifest_starts_it_in_name_order(inp, ck, caplog):
    for name in ("1", "10", "2"):
        put(inp, "a", name, [f"line-{name}"])
    commit(ck, 0, {"a": 2})  # the old offsets: 1, 10, 2 by name
    with caplog.at_level(logging.WARNING, logger="regional"):
        s = source(inp, ck)
        assert s.available(1) == {"a": 3}
    assert "has epochs but no manifest of files" in caplog.text
    assert read_all(s, "a", 2, 3) == [(2, "line-2")]


def test_a_damaged_manifest_is_a_clear_error(inp, ck):
    put(inp, "a", "1", ["x"])
    s = source(inp, ck)
    s.available(0)
    put(inp, "a", "2", ["y"])
    s.available(1)
    put(inp, "a", "3", ["z"])
    s.available(2)
    directory = Path(Store(ck).source_log("files").directory)
    names = sorted(os.listdir(directory))
    assert [re.sub(r"^\d+", "", n) for n in names] == [".snapshot.json", ".delta.json", ".delta.json"]
    (directory / names[1]).unlink()
    with pytest.raises(RegionalStoreError, match="has no file 000000000001"):
        source(inp, ck).available(3)
    (directory / names[2]).write_bytes(b"regional source-log v1 sha256=00\n{}\n")
    (directory / names[1]).write_bytes(b"regional source-log v1 sha256=00\n{}\n")
    with pytest.raises(RegionalStoreError, match="corrupt"):
        source(inp, ck).available(3)


def test_the_manifest_stays_bounded_and_compaction_keeps_the_state(inp, ck, monkeypatch):
    monkeypatch.setattr(source_log_module, "MAX_DELTAS", 8)
    monkeypatch.setattr(source_log_module, "MIN_SNAPSHOT_BYTES", 2000)
    regions = [f"r{i:02d}" for i in range(20)]
    s = source(inp, ck)
    directory = Path(Store(ck).source_log("files").directory)
    sizes = []
    for epoch in range(60):
        for r in regions[epoch % 3::3]:
            put(inp, r, f"part-{epoch}", [f"{r}-{epoch}"])
        if epoch >= 10:  # a cleanup job deletes processed files
            for r in regions:
                (inp / r / f"part-{epoch - 10}").unlink(missing_ok=True)
        ends = s.available(epoch)
        commit(ck, epoch, ends)
        files = os.listdir(directory)
        sizes.append(sum((directory / f).stat().st_size for f in files))
        assert len(files) <= 9
    assert max(sizes[30:]) < 3 * max(sizes[10:30])  # deleting processed files keeps the manifest flat
    restarted = source(inp, ck)

    def names(manifest):
        return {r: sorted((f.name, f.first_offset, f.gone) for f in m.files.values()) for r, m in manifest.items()}

    assert names(restarted.manifest()) == names(s.manifest())  # the snapshot and the deltas since: the same state
    assert restarted.available(60) == ends
    for i, r in enumerate(regions):
        assert len(restarted.manifest()[r].files) <= 4  # the last 10 epochs' files, one in three epochs
        newest = max(e for e in range(60) if e % 3 == i % 3)
        assert read_all(restarted, r, ends[r] - 1, ends[r]) == [(ends[r] - 1, f"{r}-{newest}")]


def test_a_pickled_input_carries_no_manifest_and_no_store(inp, ck):
    for i in range(50):
        put(inp, "a", f"{i}", ["x"])
    s = source(inp, ck)
    s.available(0)
    task = pickle.loads(pickle.dumps(s))
    assert task._manifest is None and task._store is None
    assert len(pickle.dumps(s)) < 2000


# -- a listing's new files are read in parallel ----------------------------------------------------------------


def test_a_listings_new_files_are_fingerprinted_on_several_threads_and_each_once(inp, ck, monkeypatch):
    """Their SHA-256 and line count are most of a listing's work, done before the epoch can be planned."""
    import threading

    read: list[tuple[str, int]] = []
    fingerprint = files_local._fingerprint_or_none
    threads: set[int] = set()
    overlapped = threading.Event()

    def counted(path, line_format):
        threads.add(threading.get_ident())
        if len(threads) > 1:
            overlapped.set()
        overlapped.wait(10)  # the first reader waits for a second thread: reads on one thread would time out here
        read.append((f"{path.parent.name}/{path.name}", threading.get_ident()))
        return fingerprint(path, line_format)

    monkeypatch.setattr(files_local, "_fingerprint_or_none", counted)
    monkeypatch.setattr(files_local, "FINGERPRINT_THREADS", 4)
    monkeypatch.setattr(files_local, "PARALLEL_FINGERPRINT_BYTES", 0)  # these files are small
    for region in ("a", "b", "c", "d"):
        for i in range(3):
            put(inp, region, f"{i}.txt", values(f"{region}{i}", 1000))
    s = source(inp, ck)
    assert s.available(0) == dict.fromkeys("abcd", 3000)
    assert sorted(name for name, _thread in read) == sorted(f"{r}/{i}.txt" for r in "abcd" for i in range(3))
    assert len({thread for _name, thread in read}) > 1
    read.clear()
    assert s.available(1) == dict.fromkeys("abcd", 3000) and read == []  # known files are not read again


def test_parallel_fingerprints_leave_the_manifest_a_sequential_listing_would(inp, tmp_path, monkeypatch):
    """New files, an empty one, one without a final newline, a hard link and a rename of a known file, a touched
    one: with one thread and with eight, the same offsets, the same files, the same warnings."""
    def layout(root):
        put(root, "a", "1", values("one", 5))
        put(root, "b", "x", values("x", 2))
        return root

    def changes(root):
        put(root, "a", "2", values("two", 7))
        (root / "a" / "3").write_bytes(b"")
        (root / "a" / "4").write_bytes(b"no final newline\nlast")
        os.link(root / "a" / "1", root / "a" / "1-link")
        os.rename(root / "b" / "x", root / "b" / "y")
        os.utime(root / "a" / "2", ns=(1, 1))
        put(root, "c", "only", values("c", 3))

    manifests = []
    monkeypatch.setattr(files_local, "PARALLEL_FINGERPRINT_BYTES", 0)
    for threads in (1, 8):
        monkeypatch.setattr(files_local, "FINGERPRINT_THREADS", threads)
        root, store = layout(tmp_path / f"in-{threads}"), tmp_path / f"ck-{threads}"
        s = source(root, store)
        first = s.available(0)
        changes(root)
        second = s.available(1)
        manifests.append((first, second, {r: [(f.name, f.first_offset, f.lines, f.size, f.digest)
                                               for f in rf.files.values()] for r, rf in s.manifest().items()}))
    assert manifests[0] == manifests[1]
    assert manifests[1][1] == {"a": 14, "b": 2, "c": 3}  # 5 + 7 + 0 + 2; the link and the rename add nothing


def test_newlines_counts_as_bytes_count_does():
    slice_ = files_lines.COUNT_SLICE
    for data in (b"", b"a", b"\n", b"a\nb\n", b"\n" * (slice_ + 3), os.urandom(3 * slice_ + 7)):
        assert files_lines.newlines(data) == data.count(b"\n")


def test_lines_are_javas_utf8_decoding_split_at_line_breaks_with_undecodable_bytes_replaced():
    """A task splits a file's bytes in Arrow without a Python string in between: the same lines as Java's decoder
    gives Spark (Python's replacement, but one U+FFFD for a UTF-8-encoded surrogate, ED A0..BF and a continuation
    byte or not: ED is never a continuation byte, so it starts a sequence, and one byte 0xFF stands for it)."""
    import random
    import re

    def spec(data: bytes) -> list[str]:  # Python's reading of a text file, line by line, as Spark's text source
        data = data.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark at the start is dropped
        text = re.sub(rb"\xed[\xa0-\xbf][\x80-\xbf]?", b"\xff", data).decode("utf-8", errors="replace")
        return text.splitlines() if data else []  # \n, \r\n or a lone \r (and, here, nothing else)

    rng = random.Random(45)
    cases = [b"", b"\n", b"a", b"\r\n", b"a\r\nb\n\r\nc", b"\xff\n", b"x\xffy\nz", b"\xed\xa0\x80\n",  # a surrogate
             b"\xc0\xaf\n", "é\n€\n𝄞".encode(), b"\xef\xbb\xbfbom\n", b"a\x00b\n", b"\n\n", b"\xed\xa0", b"\xed\xbf\nx"]
    cases += [bytes(rng.choice(b"ab\n\r\xc3\xa9\xff\xed\xa0\xbf\x9f\x80 ") for _ in range(rng.randint(0, 40)))
              for _ in range(3000)]
    for data in cases:
        if any(c in data.decode("utf-8", errors="replace") for c in "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"):
            continue  # more line breaks for splitlines than for Spark
        lines = files_lines.LineFormat().records(data)
        assert files_lines.LineFormat().count(data) == len(lines), data
        assert lines.type == files.SCHEMA.field("value").type and lines.to_pylist() == spec(data), data


def test_a_file_the_parallel_read_cannot_read_fails_the_listing_as_before_in_its_order(inp, ck, monkeypatch):
    """A read that fails in the listing's threads is left to the scan, which fails as a sequential listing did:
    here a known file that grew is named, not the unreadable new one."""
    fingerprint = files_local._fingerprint_or_none

    def unreadable(path, line_format):
        if path.name == "new-2":
            raise PermissionError(13, "Permission denied", str(path))
        return fingerprint(path, line_format)

    monkeypatch.setattr(files_local, "PARALLEL_FINGERPRINT_BYTES", 0)
    put(inp, "r", "k", values("k", 3))
    s = source(inp, ck)
    s.available(0)
    with open(inp / "r" / "k", "a") as f:
        f.write("appended\n")
    put(inp, "r", "new-1", ["one"])
    put(inp, "r", "new-2", ["two"])
    monkeypatch.setattr(files_local, "_fingerprint_or_none", unreadable)
    with pytest.raises(RegionalConfigError, match=r"file 'k' of region 'r' changed .*offsets \[0, 3\)"):
        s.available(1)


def test_a_processed_file_renamed_twice_across_two_listings_is_never_read_again(inp, ck, monkeypatch):
    """Each time renamed between a listing and the look at its content: a listing that saw a file vanish marks
    nothing missing, so the file is found again under its last name, not taken for a new one."""
    put(inp, "r", "x", ["b1", "b2", "b3"])
    put(inp, "r", "o", ["o"])
    s = source(inp, ck)
    assert s.available(0) == {"r": 4}
    commit(ck, 0, {"r": 4})
    listed = files.LocalFiles._list
    moves = iter([("x", "y"), ("y", "z"), ("z", "w"), ("w", "v")])

    def renamed_around_the_listing(self):
        before, after = next(moves)
        os.rename(inp / "r" / before, inp / "r" / after)
        listing = listed(self)
        before, after = next(moves)
        os.rename(inp / "r" / before, inp / "r" / after)  # after the listing, before its content is read
        return listing

    monkeypatch.setattr(files.LocalFiles, "_list", renamed_around_the_listing)
    assert s.available(1) == {"r": 4}
    assert s.available(2) == {"r": 4}
    monkeypatch.setattr(files.LocalFiles, "_list", listed)
    assert s.available(3) == {"r": 4}  # v is x: not 7 (its three lines again)
    assert sorted((f.name, f.first_offset, f.gone) for f in s.manifest()["r"].files.values()) == [
        ("o", 0, False), ("v", 1, False)]


def test_a_listing_that_crosses_a_log_rotation_lists_the_region_again_and_a_replaced_file_still_fails(
        inp, ck, monkeypatch):
    """``mv app.log app.log.1`` and a new ``app.log`` while the directory is read: the listing can see the new
    app.log and miss app.log.1. That looked like app.log replaced (the query failed); the region is listed again."""
    put(inp, "r", "app.log", values("day1", 3))
    s = source(inp, ck)
    assert s.available(0) == {"r": 3}
    commit(ck, 0, {"r": 3})
    os.rename(inp / "r" / "app.log", inp / "r" / "app.log.1")
    put(inp, "r", "app.log", values("day2", 5))
    visible = files_local._visible_files
    raced = []

    def half_seen(directory, accepts):
        found = visible(directory, accepts)
        if not raced:  # the first listing missed the moved file
            raced.append(directory)
            found.pop("app.log.1")
        return found

    monkeypatch.setattr(files_local, "_visible_files", half_seen)
    assert s.available(1) == {"r": 8}
    assert sorted((f.name, f.first_offset, f.lines) for f in s.manifest()["r"].files.values()) == [
        ("app.log", 3, 5), ("app.log.1", 0, 3)]
    assert read_all(s, "r", 3, 8) == list(zip(range(3, 8), values("day2", 5), strict=True))
    commit(ck, 1, {"r": 8})
    os.remove(inp / "r" / "app.log")  # replaced for real: a new file under a known name, the old one gone
    put(inp, "r", "app.log", values("other", 4))
    with pytest.raises(RegionalConfigError, match=r"file 'app.log' of region 'r' changed"):
        s.available(2)


def test_a_replaced_file_still_fails_when_its_directory_goes_before_the_second_listing(inp, ck, monkeypatch):
    """The second listing cannot be made: the first one's finding (app.log replaced) stands."""
    put(inp, "r", "app.log", values("a", 3))
    s = source(inp, ck)
    s.available(0)
    commit(ck, 0, {"r": 3})
    put(inp, "r", "app.log", values("b", 3))  # renamed over it: same size, other content, another inode
    assert (inp / "r" / "app.log").stat().st_ino != s.manifest()["r"].files[0].inode
    visible = files_local._visible_files
    calls = []

    def then_gone(directory, accepts):
        calls.append(directory)
        if len(calls) > 1 and directory.name == "r":  # the region directory goes before the second listing
            os.rename(directory, directory.parent / ".moved-away")
        return visible(directory, accepts)

    monkeypatch.setattr(files_local, "_visible_files", then_gone)
    with pytest.raises(RegionalConfigError, match=r"file 'app.log' of region 'r' changed .*same size, other content"):
        s.available(1)
