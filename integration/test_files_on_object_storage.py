"""source=files on a real S3 API server (s3proxy): offsets, the manifest and the identity rules of the local
source, with S3's own ways: one LIST per epoch for every region, a move that is a copy and a delete, an object
written again. The query end to end (files on S3 into Delta on S3) is in test_object_storage.py."""

from __future__ import annotations

import pickle
import time
import uuid

import obstore
import pytest

from regional.errors import RegionalConfigError, RegionalDataLossError
from regional.inputs import files, object_files
from regional.inputs.object_files import ObjectFiles
from regional.location import parse_location
from regional.storage import Storage, open_storage
from regional.store import EpochKind, EpochRecord, RegionState, Store


@pytest.fixture
def bucket(s3) -> str:
    return s3.create_bucket(f"files-{uuid.uuid4().hex[:12]}")


def put(storage: Storage, key: str, values: list[str]) -> None:
    storage.write(key, "".join(v + "\n" for v in values).encode())


def move(storage: Storage, old: str, new: str) -> None:
    """What ``aws s3 mv`` does: a copy, then a delete."""
    storage.write(new, storage.read(old) or b"")
    storage.delete(old)


def source(path: str, ck) -> ObjectFiles:
    s = files.create({"path": path})
    assert isinstance(s, ObjectFiles)
    s.decide_schema()  # the columns, as .load() decides them (one LIST, before the query's own)
    s.use_store(Store(ck))
    return s


def read_all(s: files.FilesInput, region: str, start: int, end: int) -> list[tuple[int, str]]:
    split = pickle.loads(pickle.dumps(s.split(region, start, end)))  # as the task gets it
    task = pickle.loads(pickle.dumps(s))
    return [(row["offset"], row["value"]) for b in task.read(region, start, end, split) for row in b.to_pylist()]


def commit(ck, epoch: int, committed: dict[str, int]) -> None:
    Store(ck).write_record(EpochRecord(epoch, EpochKind.GLOBAL, {}, {},
                                       {r: RegionState(o, epoch) for r, o in committed.items()}))


def test_regions_are_prefixes_and_new_files_come_after_known_ones_whatever_their_names(bucket, tmp_path):
    path = f"{bucket}/in"
    storage = open_storage(parse_location("path", path))
    put(storage, "a/002.txt", ["a0", "a1", "a2"])
    put(storage, "b/001.txt", ["b0", "b1"])
    put(storage, "_spark_metadata/0", ["hidden region"])
    put(storage, "a/_002.txt.tmp", ["hidden file"])
    put(storage, "a/_temporary/0/x.txt", ["in a hidden directory"])
    put(storage, "a/sub/deep.txt", ["a-deep"])  # below a region: a file of it, by its path under the region
    put(storage, "top.txt", ["no region's"])  # directly under path: no region would read it, so it fails
    ck = tmp_path / "ck"
    with pytest.raises(RegionalConfigError, match=r"'top\.txt' is directly under path"):
        source(path, ck).available(0)
    storage.delete("top.txt")
    s = source(path, ck)
    assert s.available(0) == {"a": 4, "b": 2}
    assert read_all(s, "a", 1, 4) == [(1, "a1"), (2, "a2"), (3, "a-deep")]
    put(storage, "a/001.txt", ["a3"])  # sorts first, arrives later: after every known file
    assert s.available(1) == {"a": 5, "b": 2}
    assert read_all(s, "a", 0, 5) == [(0, "a0"), (1, "a1"), (2, "a2"), (3, "a-deep"), (4, "a3")]
    assert source(path, ck).available(2) == {"a": 5, "b": 2}  # a restarted driver: the same offsets
    with pytest.raises(RegionalConfigError, match="path is now"):
        source(f"{bucket}/elsewhere", ck).available(3)


def test_one_listing_per_epoch_for_every_region(bucket, tmp_path):
    path = f"{bucket}/many"
    storage = open_storage(parse_location("path", path))
    for i in range(60):
        put(storage, f"r{i:03d}/001.txt", [f"r{i}-0"])
    s = source(path, tmp_path / "ck")
    lists = []
    real_list = s.storage.list

    def counting_list(directory: str = "", recursive: bool = False):
        lists.append((directory, recursive))
        return real_list(directory, recursive)

    s.storage.list = counting_list  # type: ignore[method-assign]
    assert len(s.available(0)) == 60
    put(storage, "r007/002.txt", ["r7-1"])
    assert s.available(1)["r007"] == 2
    assert lists == [("", True), ("", True)]


def test_a_move_seen_whole_is_the_same_file_and_the_same_bytes_elsewhere_are_new_input(bucket, tmp_path):
    path = f"{bucket}/in"
    storage = open_storage(parse_location("path", path))
    ck = tmp_path / "ck"
    put(storage, "a/001.txt", ["x0", "x1"])
    put(storage, "a/002.txt", ["y0"])
    s = source(path, ck)
    assert s.available(0) == {"a": 3}
    split = s.split("a", 0, 3)
    move(storage, "a/001.txt", "a/renamed.txt")  # records unpublished, the move seen whole: the same file
    assert s.available(1) == {"a": 3}
    assert read_all(s, "a", 0, 3) == [(0, "x0"), (1, "x1"), (2, "y0")]
    task = pickle.loads(pickle.dumps(s))  # a task planned before the move finds the file under its new name
    assert [r["value"] for b in task.read("a", 0, 2, split) for r in b.to_pylist()] == ["x0", "x1"]

    copy(storage, "a/002.txt", "a/copy.txt")  # a copy: new input at once (a move caught mid-way is one too)
    assert s.available(2) == {"a": 4}
    assert read_all(s, "a", 3, 4) == [(3, "y0")]

    commit(ck, 0, {"a": 4})
    storage.delete("a/copy.txt")
    put(storage, "a/heartbeat.txt", ["y0"])  # the same bytes as a published file deleted now: new input
    assert s.available(3) == {"a": 5}
    assert read_all(s, "a", 4, 5) == [(4, "y0")]
    commit(ck, 1, {"a": 5})
    move(storage, "a/renamed.txt", "a/renamed-again.txt")  # a published file moved: read again, as in Spark
    assert s.available(4) == {"a": 7}


def test_an_object_written_again_with_other_content_fails_naming_it_and_byte_equal_is_the_same(bucket, tmp_path):
    path = f"{bucket}/in"
    storage = open_storage(parse_location("path", path))
    put(storage, "a/001.txt", ["one", "two"])
    s = source(path, tmp_path / "ck")
    assert s.available(0) == {"a": 2}
    split = s.split("a", 0, 2)
    etag = storage.head("a/001.txt").etag
    obstore.put(storage.store, storage.key("a/001.txt"), b"one\ntwo\n", use_multipart=True)
    assert storage.head("a/001.txt").etag != etag  # the same bytes, another ETag
    assert s.available(1) == {"a": 2}  # the same file
    put(storage, "a/001.txt", ["ONE", "TWO"])  # same size, other content
    with pytest.raises(RegionalConfigError, match=r"'001\.txt' of region 'a' changed"):
        s.available(2)
    task = pickle.loads(pickle.dumps(s))
    with pytest.raises(RegionalConfigError, match="other content when a task read it"):
        list(task.read("a", 0, 2, split))
    put(storage, "a/001.txt", ["one", "two", "three"])  # longer: an object store cannot append
    with pytest.raises(RegionalConfigError, match="8 bytes when first seen, 14 now"):
        s.available(3)
    put(storage, "a/001.txt", ["one", "two"])  # put back as it was: the query goes on
    assert s.available(4) == {"a": 2}


def test_a_file_deleted_with_records_unpublished_fails_and_a_processed_one_may_go(bucket, tmp_path):
    path = f"{bucket}/in"
    storage = open_storage(parse_location("path", path))
    ck = tmp_path / "ck"
    put(storage, "a/001.txt", ["a0", "a1"])
    put(storage, "a/002.txt", ["a2"])
    put(storage, "a/003.txt", ["a3"])
    put(storage, "b/001.txt", ["b0"])
    s = source(path, ck)
    assert s.available(0) == {"a": 4, "b": 1}
    commit(ck, 0, {"a": 2, "b": 1})
    storage.delete("a/001.txt")  # published: may go
    storage.delete("b/001.txt")  # region b's last object: its prefix is gone, its records published
    assert s.available(1) == {"a": 4}
    assert s.available(2) == {"a": 4}
    assert [sp.name for sp in s.manifest()["a"].files.values()] == ["002.txt", "003.txt"]
    put(storage, "b/002.txt", ["b1"])  # b comes back: after its old offsets
    assert s.available(3) == {"a": 4, "b": 2}
    storage.delete("a/002.txt")  # offset 2 unpublished
    s.available(4)  # missing once: marked
    with pytest.raises(RegionalDataLossError, match=r"'002\.txt' of region 'a' .* offsets \[2, 3\) not yet published"):
        s.available(5)
    put(storage, "a/002.txt", ["a2"])  # put back: the query goes on
    assert s.available(6) == {"a": 4, "b": 2}
    assert read_all(s, "a", 2, 4) == [(2, "a2"), (3, "a3")]
    for name in ("002.txt", "003.txt"):  # every object of a region with records unpublished: fails at once
        storage.delete(f"a/{name}")
    with pytest.raises(RegionalDataLossError, match=r"region directory 'a' .* removed with offsets \[2, 4\)"):
        s.available(7)


def test_a_renamed_region_prefix_is_refused(bucket, tmp_path):
    path = f"{bucket}/in"
    storage = open_storage(parse_location("path", path))
    put(storage, "old/001.txt", ["r0", "r1"])
    s = source(path, tmp_path / "ck")
    assert s.available(0) == {"old": 2}
    move(storage, "old/001.txt", "new/001.txt")
    with pytest.raises(RegionalConfigError, match="was 'old' renamed to 'new'"):
        s.available(1)
    commit(tmp_path / "ck", 0, {"old": 2})
    with pytest.raises(RegionalConfigError, match="was 'old' renamed to 'new'"):
        s.available(2)  # published or not: 'new' would read them again
    put(storage, "old/002.txt", ["r2"])  # to read them again on purpose: the old prefix stays
    assert s.available(3) == {"new": 2, "old": 3}


def copy(storage: Storage, old: str, new: str) -> None:
    storage.write(new, storage.read(old) or b"")


def test_mv_over_a_known_name_caught_mid_way_is_held_for_a_time_not_a_count_of_listings(bucket, tmp_path,
                                                                                        monkeypatch):
    """Spark may list twice within milliseconds: ``mv B A`` over a known A, between its copy and its delete, is
    still held when the delete lands; a copy that stays past the grace is a file written again."""
    monkeypatch.setattr(object_files, "COPY_GRACE_S", 1.0)
    path = f"{bucket}/in"
    storage = open_storage(parse_location("path", path))
    put(storage, "a/A.txt", ["aaaa"])
    put(storage, "a/B.txt", ["bbbb"])
    s = source(path, tmp_path / "ck")
    assert s.available(0) == {"a": 2}
    commit(tmp_path / "ck", 0, {"a": 1})  # A's record published: A may be replaced
    copy(storage, "a/B.txt", "a/A.txt")
    assert s.available(1) == {"a": 2}
    assert s.available(2) == {"a": 2}
    storage.delete("a/B.txt")
    assert s.available(3) == {"a": 2}
    assert [(sp.name, sp.first_offset, sp.gone) for sp in s.manifest()["a"].files.values()] == [
        ("A.txt", 0, True), ("A.txt", 1, False)]  # A's first bytes are gone; B's are at A
    put(storage, "a/C.txt", ["cccc"])
    assert s.available(4) == {"a": 3}
    copy(storage, "a/C.txt", "a/A.txt")  # and this copy stays
    assert s.available(5) == {"a": 3}
    time.sleep(1.1)
    with pytest.raises(RegionalConfigError, match=r"'A\.txt' of region 'a' changed"):
        s.available(6)


def test_moves_over_a_known_name(bucket, tmp_path, monkeypatch):
    """``mv B A`` where A exists (B's records unpublished): caught between its copy and its delete, and seen
    whole while a third file holds B's bytes; and A written again with new bytes: refused."""
    monkeypatch.setattr(object_files, "COPY_GRACE_S", 0.0)
    path = f"{bucket}/in"
    storage = open_storage(parse_location("path", path))
    ck = tmp_path / "ck"
    put(storage, "a/A.txt", ["aaaa"])
    put(storage, "a/B.txt", ["bbbb"])
    s = source(path, ck)
    assert s.available(0) == {"a": 2}
    commit(ck, 0, {"a": 1})
    copy(storage, "a/B.txt", "a/A.txt")
    assert s.available(1) == {"a": 2}  # mid-move: decided later
    storage.delete("a/B.txt")
    assert s.available(2) == {"a": 2}
    assert read_all(s, "a", 1, 2) == [(1, "bbbb")]  # B, now at A

    put(storage, "a/C.txt", ["cccc"])
    assert s.available(3) == {"a": 3}
    copy(storage, "a/C.txt", "a/D.txt")
    assert s.available(4) == {"a": 4}  # D: a copy, new input
    assert s.available(5) == {"a": 4}
    commit(ck, 1, {"a": 2})  # B's record, at A: published (A may be replaced)
    copy(storage, "a/C.txt", "a/A.txt")  # `mv C A` seen whole, while D holds C's bytes too
    storage.delete("a/C.txt")
    assert s.available(6) == {"a": 4}
    assert read_all(s, "a", 2, 4) == [(2, "cccc"), (3, "cccc")]

    commit(ck, 2, {"a": 4})
    storage.delete("a/D.txt")
    s.available(7)  # D seen gone
    put(storage, "a/A.txt", ["cccc"])  # byte-equal: the same file
    assert s.available(8) == {"a": 4}
    put(storage, "a/A.txt", ["dddd"])
    with pytest.raises(RegionalConfigError, match=r"'A\.txt' of region 'a' changed"):
        s.available(9)


def test_a_task_finds_a_file_moved_after_the_plan(bucket, tmp_path):
    """Moved after its epoch was planned: among more than 16 objects of its size (fixed-size files), with a
    new file of the same size under its old name (a rotation)."""
    path = f"{bucket}/in"
    storage = open_storage(parse_location("path", path))
    ck = tmp_path / "ck"
    line = "x" * 20
    put(storage, "a/cur.log", [f"{line}-{0:03d}"])
    for i in range(1, 21):
        put(storage, f"a/other-{i:02d}.log", [f"{line}-{i:03d}"])
    s = source(path, ck)
    assert s.available(0) == {"a": 21}
    split = s.split("a", 0, 1)
    storage.write("a/zz.log", (storage.read("a/cur.log") or b"") + b"")  # a copy under a new name ...
    storage.delete("a/cur.log")  # ... and the delete: a move
    put(storage, "a/cur.log", [f"{line}-new"])  # the same size, other bytes, under the old name
    task = pickle.loads(pickle.dumps(s))
    assert [r["value"] for b in task.read("a", 0, 1, split) for r in b.to_pylist()] == [f"{line}-000"]
    assert read_all(source(path, ck), "a", 0, 1) == [(0, f"{line}-000")]  # a restarted driver re-runs the plan


def test_review_cases_heartbeats_a_published_file_put_back_and_a_racing_listing(bucket, tmp_path):
    """A heartbeat (the same bytes) after the processed one was deleted; a published file put back under its
    name; and a listing that raced with a second move (an object gone between the LIST and its GET)."""
    path = f"{bucket}/in"
    storage = open_storage(parse_location("path", path))
    ck = tmp_path / "ck"
    put(storage, "a/C.txt", ["x0", "x1"])
    put(storage, "a/final.txt", ["u0"])
    s = source(path, ck)
    assert s.available(0) == {"a": 3}
    commit(ck, 0, {"a": 3})
    put(storage, "a/hb-2.txt", ["x0", "x1"])  # the same bytes as C, which is published: new input at once
    storage.delete("a/C.txt")  # the cleanup of processed files, in the same listing
    assert s.available(5) == {"a": 5}
    commit(ck, 1, {"a": 5})
    storage.delete("a/hb-2.txt")
    assert s.available(6) == {"a": 5}
    put(storage, "a/hb-2.txt", ["x0", "x1"])  # a published file's name and bytes again: new input
    assert s.available(7) == {"a": 7}
    assert read_all(s, "a", 5, 7) == [(5, "x0"), (6, "x1")]

    put(storage, "a/D.txt", ["d0"])
    assert s.available(8) == {"a": 8}
    move(storage, "a/D.txt", "a/E.txt")
    real_list = s.storage.list

    def list_then_move_again(directory: str = "", recursive: bool = False):
        listed = real_list(directory, recursive)
        if recursive and storage.head("a/E.txt") is not None:
            move(storage, "a/E.txt", "a/F.txt")  # after the LIST, before the GET of E
        return listed

    s.storage.list = list_then_move_again  # type: ignore[method-assign]
    assert s.available(9) == {"a": 8}  # the listing raced, and was made again: D moved, to F
    assert [sp.name for sp in s.manifest()["a"].files.values()][-1] == "F.txt"
    s.storage.list = real_list  # type: ignore[method-assign]
    assert s.available(10) == {"a": 8}
    assert read_all(s, "a", 7, 8) == [(7, "d0")]


def test_a_recorded_epoch_re_run_after_its_files_were_deleted_reads_nothing_it_needs_not(bucket, tmp_path):
    """Spark re-runs the last planned batch after a restart; its records are published and the processed file
    was deleted meanwhile: the plan skips it (no task fails on it)."""
    path = f"{bucket}/in"
    storage = open_storage(parse_location("path", path))
    ck = tmp_path / "ck"
    put(storage, "a/001.txt", ["a0", "a1"])
    put(storage, "a/002.txt", ["a2"])
    s = source(path, ck)
    assert s.available(0) == {"a": 3}
    commit(ck, 0, {"a": 2})
    storage.delete("a/001.txt")
    restarted = source(path, ck)
    assert restarted.split("a", 0, 2) == []
    assert read_all(restarted, "a", 0, 3) == [(2, "a2")]


def test_compressed_objects_are_read_decompressed_and_a_compressed_copy_of_a_known_one_is_that_file(bucket, tmp_path):
    """logrotate's compress + delaycompress on an object store: app.log.1's bytes come back as app.log.2.gz; the
    records are not read twice (Spark's file source would read the .gz as a new file)."""
    import gzip

    path = f"{bucket}/in"
    storage = open_storage(parse_location("path", path))
    storage.write("r/app.log.1", b"l1\r\nl2\rl3")  # Windows and old-Mac line breaks: three records
    storage.write("r/old.gz", gzip.compress(b"\xef\xbb\xbfg1\ng2\n"))  # a BOM, dropped
    ck = tmp_path / "ck"
    s = source(path, ck)
    assert s.available(0) == {"r": 5}
    assert read_all(s, "r", 0, 5) == [(0, "l1"), (1, "l2"), (2, "l3"), (3, "g1"), (4, "g2")]
    commit(ck, 0, {"r": 5})
    storage.write("r/app.log.2.gz", gzip.compress(storage.read("r/app.log.1") or b""))
    assert s.available(1) == {"r": 5}  # app.log.1 is still there: the .gz is it, not new input
    storage.delete("r/app.log.1")
    assert s.available(2) == {"r": 5}
    assert s.available(3) == {"r": 5}
    names = sorted((f.name, f.first_offset, f.lines) for f in s.manifest()["r"].files.values())
    assert names == [("app.log.2.gz", 0, 3), ("old.gz", 3, 2)]
    assert read_all(s, "r", 0, 3) == [(0, "l1"), (1, "l2"), (2, "l3")]  # read from the .gz, decompressed
    storage.write("r/bad.gz", b"not gzip at all")
    with pytest.raises(RegionalConfigError, match=r"object 'r/bad.gz' .* is not valid gzip data"):
        s.available(4)
