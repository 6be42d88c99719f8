"""source=files as Spark's text source reads (issue 46), without Spark: records and their count over chunks, codecs,
nested directories, pathGlobFilter, compressed copies of known files, and checkpoints counted by the old rules.
The differential tests against spark.read.text itself are in integration/test_files_like_spark.py."""

from __future__ import annotations

import gzip
import hashlib
import os
import random

import pytest

from regional.errors import RegionalConfigError
from regional.inputs import files
from regional.inputs.files.lines import BOM, CorruptFile, LineFormat, decompress
from regional.inputs.files.manifest import glob_regex
from regional.store import EpochKind, EpochRecord, RegionState, Store
from support import files_source as source
from support import write_file as write


def commit(ck, epoch, committed):
    Store(ck).write_record(EpochRecord(epoch, EpochKind.GLOBAL, {}, {},
                                       {r: RegionState(o, epoch) for r, o in committed.items()}))


def read_all(s, region, start, end):
    return [row["value"] for b in s.read(region, start, end, s.split(region, start, end)) for row in b.to_pylist()]


def hadoop_lines(data: bytes) -> list[str]:
    """Hadoop's LineRecordReader, as measured with spark.read.text: a BOM at the start dropped; \\n, \\r\\n, \\r."""
    data = data.removeprefix(BOM)
    text = data.decode("utf-8", errors="replace")
    return text.splitlines() if data else []


def test_the_driver_counts_over_chunks_what_the_task_splits_a_cr_lf_across_chunks_is_one_break():
    rng = random.Random(46)
    for _ in range(3000):
        data = bytes(rng.choice(b"ab\r\n\xef\xbb\xbf") for _ in range(rng.randint(0, 30)))
        if rng.random() < 0.3:
            data = BOM + data
        cuts = sorted(rng.sample(range(len(data) + 1), k=min(len(data) + 1, rng.randint(0, 6))))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        size, lines, digest, content = LineFormat().fingerprint("f.txt", iter(chunks))
        records = LineFormat().records(data).to_pylist()
        assert (size, lines, content) == (len(data), len(records), None), (data, chunks)
        assert digest == hashlib.sha256(data).hexdigest()[:32]
        assert records == hadoop_lines(data), data


def test_line_sep_and_wholetext_count_what_they_split():
    cases = [b"", b"|", b"a|b\nc||d|", b"\xef\xbb\xbfa|b", b"||", b"a", b"a\r\n|"]
    for data in cases:
        for fmt in (LineFormat("|"), LineFormat("||"), LineFormat("\r\n"), LineFormat(wholetext=True)):
            records = fmt.records(data).to_pylist()
            assert fmt.count(data) == len(records) == fmt.fingerprint("f", [data])[1], (fmt, data)
    assert LineFormat("|").records(b"a|b\nc||d|").to_pylist() == ["a", "b\nc", "", "d"]  # as spark.read.text
    assert LineFormat("||").records(b"a|b\nc||d|").to_pylist() == ["a|b\nc", "d|"]
    assert LineFormat("\r").records(b"a\rb\r\nc\nd").to_pylist() == ["a", "b", "\nc\nd"]
    assert LineFormat(wholetext=True).records(b"\xef\xbb\xbfa\r\nb").to_pylist() == ["\ufeffa\r\nb"]  # BOM kept
    assert LineFormat(wholetext=True).records(b"").to_pylist() == []


def test_a_corrupt_compressed_file_is_named_and_hadoop_block_framing_is_checked():
    with pytest.raises(CorruptFile, match="not valid gzip"):
        decompress("gzip", b"plain text")
    with pytest.raises(CorruptFile):
        decompress("lz4", b"\x00\x00\x00\x10\x00\x00\x00\x04abcd")  # a block of 16 bytes, a chunk that is not LZ4
    with pytest.raises(CorruptFile, match="truncated"):
        decompress("snappy", b"\x00\x00\x00\x10\x00\x00")
    assert decompress("gzip", gzip.compress(b"a\n") + gzip.compress(b"b\n")) == b"a\nb\n"  # members concatenated


def test_nested_directories_are_read_in_one_documented_order_and_hidden_ones_are_not(tmp_path):
    inp, ck = tmp_path / "in", tmp_path / "ck"
    write(inp / "r" / "b.txt", b"b\n")
    write(inp / "r" / "a" / "z.txt", b"az\n")
    write(inp / "r" / "a" / "deeper" / "y.txt", b"ady\n")
    write(inp / "r" / "_tmp" / "x.txt", b"hidden\n")
    write(inp / "r" / ".git" / "x.txt", b"hidden\n")
    write(inp / "r" / "c.txt._COPYING_", b"hidden\n")
    s = source(inp, ck)
    assert s.available(0) == {"r": 3}
    assert read_all(s, "r", 0, 3) == ["ady", "az", "b"]  # one listing: by path under the region
    commit(ck, 0, {"r": 3})
    write(inp / "r" / "a" / "0.txt", b"late\n")  # sorts first, arrives later: after every known file
    os.rename(inp / "r" / "a" / "z.txt", inp / "r" / "moved-up.txt")  # a rename across directories: the same file
    (inp / "r" / "b.txt").unlink()  # a processed file deleted: harmless
    assert s.available(1) == {"r": 4}
    assert s.available(2) == {"r": 4}
    assert read_all(s, "r", 3, 4) == ["late"]
    assert sorted((f.name, f.first_offset) for f in s.manifest()["r"].files.values()) == [
        ("a/0.txt", 3), ("a/deeper/y.txt", 0), ("moved-up.txt", 1)]


def test_a_file_directly_under_path_and_partition_directories_are_never_silence(tmp_path):
    inp, ck = tmp_path / "in", tmp_path / "ck"
    write(inp / "r" / "a.txt", b"a\n")
    write(inp / "stray.txt", b"no region's\n")
    with pytest.raises(RegionalConfigError, match=r"'stray\.txt' is a file directly under path"):
        source(inp, ck).available(0)
    (inp / "stray.txt").unlink()
    write(inp / "date=2026-11-26" / "p.txt", b"p\n")
    with pytest.raises(RegionalConfigError, match=r"'date=2026-11-26' under .* looks like a partition directory"):
        source(inp, ck).available(0)
    os.rename(inp / "date=2026-11-26", inp / "r" / "date=2026-11-26")
    with pytest.raises(RegionalConfigError, match="recursiveFileLookup"):
        source(inp, ck).available(0)
    s = source(inp, ck, recursiveFileLookup="true")
    assert s.available(0) == {"r": 2}
    assert read_all(s, "r", 0, 2) == ["a", "p"]


def test_path_glob_filter_is_hadoops_glob_on_the_files_own_name(tmp_path):
    def matches(pattern, name):
        return glob_regex(pattern).fullmatch(name) is not None

    assert matches("*.txt", "a.txt") and not matches("*.txt", "a.txt.gz")
    assert matches("part-{0,1}?.log", "part-1x.log") and not matches("part-{0,1}?.log", "part-2x.log")
    assert matches("[^a]*", "b") and not matches("[!a]*", "a") and matches(r"a\*", "a*")
    inp, ck = tmp_path / "in", tmp_path / "ck"
    write(inp / "r" / "keep.log", b"k\n")
    write(inp / "r" / "sub" / "also.log", b"s\n")
    write(inp / "r" / "skip.txt", b"x\n")
    s = source(inp, ck, pathGlobFilter="*.log")
    assert s.available(0) == {"r": 2}
    assert read_all(s, "r", 0, 2) == ["k", "s"]


@pytest.mark.parametrize("ext", [".gz", ".GZ"])
def test_a_compressed_copy_of_a_known_file_is_that_file_and_takes_its_place_once_it_is_gone(tmp_path, caplog, ext):
    """logrotate's compress + delaycompress: app.log.2.gz holds app.log.2's bytes; the original is deleted after.
    Its unpublished records are read from the .gz, and nothing is read twice (an upper-case .GZ too: issue 59)."""
    inp, ck = tmp_path / "in", tmp_path / "ck"
    text = b"l0\nl1\r\nl2\rl3\n"
    write(inp / "r" / "app.log.2", text)
    s = source(inp, ck)
    assert s.available(0) == {"r": 4}
    commit(ck, 0, {"r": 2})  # l0, l1 published; l2, l3 not yet
    write(inp / "r" / f"app.log.2{ext}", gzip.compress(text))
    assert s.available(1) == {"r": 4}  # both there: the .gz is app.log.2, not new input
    assert f"app.log.2{ext}" in caplog.text and "not read twice" in caplog.text
    (inp / "r" / "app.log.2").unlink()
    assert s.available(2) == {"r": 4}
    assert s.available(3) == {"r": 4}  # no loss reported: the .gz holds the offsets
    assert [(f.name, f.first_offset, f.lines) for f in s.manifest()["r"].files.values()] == [(f"app.log.2{ext}", 0,
                                                                                                4)]
    assert read_all(s, "r", 2, 4) == ["l2", "l3"]
    write(inp / "r" / "other.gz", gzip.compress(b"new\n"))  # any other compressed file is new input
    assert s.available(4) == {"r": 5}
    assert read_all(s, "r", 4, 5) == ["new"]
    write(inp / "r" / "hb-2.txt.gz", gzip.compress(text))  # the same bytes, but no rotation of app.log.2: new input
    assert s.available(5) == {"r": 9}
    assert read_all(s, "r", 5, 9) == ["l0", "l1", "l2", "l3"]


def test_the_line_format_is_fixed_for_the_checkpoint_and_refused_changed_with_safe_advice(tmp_path):
    inp, ck = tmp_path / "in", tmp_path / "ck"
    write(inp / "r" / "a.txt", b"a|b\n")
    assert source(inp, ck, lineSep="|").available(0) == {"r": 2}
    for options in ({}, {"wholetext": "true"}, {"lineSep": "\n"}):
        with pytest.raises(RegionalConfigError, match=r"counted the lines of its files with lineSep='\|'.*new "
                                                      r"checkpointLocation and a new, empty target"):
            source(inp, ck, **options).available(1)
    assert source(inp, ck, lineSep="|").available(1) == {"r": 2}


def test_options_spark_has_and_regional_refuses_are_refused_at_start(tmp_path):
    for options, says in [({"encoding": "UTF-16"}, "only UTF-8"), ({"charset": "latin1"}, "only UTF-8"),
                          ({"ignoreMissingFiles": "true"}, "lose its records"), ({"lineSep": ""}, "empty string"),
                          ({"wholetext": "yes"}, "true or false")]:
        with pytest.raises(RegionalConfigError, match=says):
            files.create({"path": str(tmp_path), **options})
    assert files.create({"path": str(tmp_path), "encoding": "utf8", "ignoreCorruptFiles": "false"}) is not None
    declared = {o.name for o in files.OPTIONS.options}
    spark_options = {"lineSep", "wholetext", "encoding", "charset", "pathGlobFilter", "recursiveFileLookup",
                     "basePath", "ignoreCorruptFiles", "ignoreMissingFiles", "maxFilesPerTrigger", "maxBytesPerTrigger",
                     "latestFirst", "maxFileAge", "cleanSource", "sourceArchiveDir", "fileNameOnly",
                     "modifiedBefore", "modifiedAfter", "maxCachedFiles", "discardCachedInputRatio", "compression"}
    assert spark_options <= declared


def test_a_checkpoint_counted_by_the_old_rules_keeps_reading_its_files_as_they_were_counted(tmp_path):
    """Before issue 46, '\\n' alone ended a line: 'a1\\rb1\\n' was one record. Its manifest (no "rules") keeps that
    file's offsets meaning what they meant; files new to it are read as Spark reads them."""
    inp, ck = tmp_path / "in", tmp_path / "ck"
    old = b"\xef\xbb\xbfa1\rb1\nc1\n"
    write(inp / "r" / "old.txt", old)
    st = (inp / "r" / "old.txt").stat()
    digest = hashlib.sha256(old).hexdigest()[:32]
    Store(ck).source_log("files").write_snapshot({  # what the code before wrote: no "rules", no "format"
        "source": "files", "path": str(inp),
        "regions": {"r": {"end": 2, "next": 1, "files": [[0, "old.txt", 0, 2, len(old), st.st_ino, st.st_mtime_ns,
                                                             digest, False]]}}})
    commit(ck, 0, {"r": 1})
    write(inp / "r" / "new.txt", b"\xef\xbb\xbfx\ry\n")
    s = source(inp, ck)
    assert s.available(1) == {"r": 4}
    assert read_all(s, "r", 1, 4) == ["c1", "x", "y"]
    assert read_all(s, "r", 0, 1) == ["\ufeffa1\rb1"]  # as it was counted (and published) then
    s2 = source(inp, ck)  # a restart reads the manifest it wrote since: the same rules per file
    assert s2.available(2) == {"r": 4}
    assert read_all(s2, "r", 0, 4) == ["\ufeffa1\rb1", "c1", "x", "y"]


@pytest.mark.parametrize("seen_mid_way", [False, True], ids=["whole", "mid-way"])
def test_logrotate_compress_and_delaycompress_rotations_read_every_line_once(tmp_path, seen_mid_way):
    """Each rotation as logrotate makes it: the .1 moves to .2 and is compressed to .2.gz, then the .2 is removed;
    .2.gz moves to .3.gz at the next. ``seen_mid_way``: a listing also sees the .2 (just renamed) beside its .2.gz."""
    inp, ck = tmp_path / "in", tmp_path / "ck"
    log = inp / "r"
    days = [[f"day{d}-{i}" for i in range(3 + d)] for d in range(5)]
    text = ["".join(v + "\n" for v in day).encode() for day in days]
    published: list[str] = []
    s = source(inp, ck)

    def run(epoch):
        end = s.available(epoch)["r"]
        published.extend(read_all(s, "r", len(published), end))
        commit(ck, epoch, {"r": end})

    write(log / "app.log", text[0])
    run(0)
    for day in range(1, 5):
        if (log / "app.log.2.gz").exists():
            os.rename(log / "app.log.2.gz", log / "app.log.3.gz")
        if (log / "app.log.1").exists():
            os.rename(log / "app.log.1", log / "app.log.2")
            write(log / "app.log.2.gz", gzip.compress((log / "app.log.2").read_bytes()))
            if seen_mid_way:
                os.rename(log / "app.log", log / "app.log.1")
                run(day + 200)
            (log / "app.log.2").unlink()
        if not (log / "app.log.1").exists():
            os.rename(log / "app.log", log / "app.log.1")
        write(log / "app.log", text[day])
        run(day)
        run(day + 100)  # a second listing: whatever went missing is dropped, nothing read again
    assert published == [v for day in days for v in day]


# Spark 4.2's spark.read.text, observed (issue 59): a lineSep is found from the file's start, each occurrence after
# the last; a file ending in it has no empty last record
OVERLAPPING_SEPARATORS = [
    (b"rec1\nl2\n\nrec2\n\n\n", "\n\n", ["rec1\nl2", "rec2", "\n"]),
    (b"a||b|||c||||", "||", ["a", "b", "|c", ""]),
    (b"|||", "||", ["", "|"]),
    (b"a|||", "||", ["a", "|"]),
    (b"\n\n\n", "\n\n", ["", "\n"]),
    (b"xabababy", "aba", ["x", "baby"]),
    (b"ababab", "abab", ["", "ab"]),
    (b"aaab", "aab", ["a"]),
    (b"xaaabaab", "aab", ["xa", ""]),
    (b"\xef\xbb\xbf||||", "||", ["", ""]),
]


@pytest.mark.parametrize("data, sep, spark", OVERLAPPING_SEPARATORS)
def test_a_line_sep_that_overlaps_itself_splits_as_sparks(data, sep, spark):
    fmt = LineFormat(sep)
    assert fmt.records(data).to_pylist() == spark
    assert fmt.count(data) == len(spark)
    size, lines, _digest, _content = fmt.fingerprint("f.txt", [data[:3], data[3:]])  # the driver's count, in chunks
    assert (size, lines) == (len(data), len(spark))


def test_line_sep_records_and_count_agree_with_a_split_from_the_start_over_random_files():
    rng = random.Random(59)
    for _ in range(5000):
        sep = rng.choice(["||", "\n\n", "aba", "aab", "abab", "|", "xyx", "€€"])
        data = "".join(rng.choice(["|", "\n", "a", "b", "x", "y", "€"]) for _ in range(rng.randint(0, 16))).encode()
        pieces = data.split(sep.encode()) if data else []
        want = [p.decode() for p in (pieces[:-1] if pieces and pieces[-1] == b"" else pieces)]
        assert LineFormat(sep).records(data).to_pylist() == want, (data, sep)
        assert LineFormat(sep).count(data) == len(want), (data, sep)


@pytest.mark.parametrize("name", ["app.log.GZ", "app.log.Gz", "x.BZ2", "x.ZST", "x.DEFLATE", "x.txt.gZ"])
def test_a_codec_extension_in_any_case_is_decompressed_as_spark_does(name):
    import bz2
    import zlib

    import zstandard

    compress = {"gz": gzip.compress, "bz2": bz2.compress, "zst": zstandard.ZstdCompressor().compress,
                "deflate": zlib.compress}[name.rsplit(".", 1)[1].lower()]
    raw = compress(b"g1\ng2\n")
    assert LineFormat().decoded(name, raw).to_pylist() == ["g1", "g2"]
    assert LineFormat().fingerprint(name, [raw])[1] == 2


def test_files_counted_with_rules_1_are_read_as_they_were_counted():
    """A .GZ file and an overlapping lineSep counted before issue 59 (manifest rules 1) keep their records: their
    offsets were given out as those."""
    raw = gzip.compress(b"g1\ng2\n", mtime=0)
    old = LineFormat().for_rules(1)
    assert old.count(raw) == len(old.decoded("a.GZ", raw)) and old.decoded("a.GZ", raw).to_pylist() != ["g1", "g2"]
    assert LineFormat("||").for_rules(1).records(b"a|||").to_pylist() == ["a|"]
    assert LineFormat("||").for_rules(1).count(b"a|||") == 1
    assert LineFormat().for_rules(0).legacy


# Java's UTF-8 decoder (String(bytes, UTF_8), what Spark's strings show), observed with Spark 4.2 and Java 17
JAVA_DECODED = [
    (b"a\xed\xa0\x80b", "a\ufffdb"),  # a UTF-8-encoded surrogate: one (Python's replace: three)
    (b"\xed\xbf\xbf", "\ufffd"),
    (b"\xed\xa0\xbd\xed\xb8\x80", "\ufffd\ufffd"),  # a surrogate pair, each half encoded alone
    (b"a\xed\xa0b", "a\ufffdb"),
    (b"a\xed\xa0", "a\ufffd"),
    (b"\xed\x9f\xbf", "\ud7ff"),
    (b"a\x80b", "a\ufffdb"),
    (b"a\xe2\x82b", "a\ufffdb"),
    (b"a\xf0\x9f\x98b", "a\ufffdb"),
    (b"a\xc0\xafb", "a\ufffd\ufffdb"),
    (b"a\xf5\x80\x80\x80b", "a\ufffd\ufffd\ufffd\ufffdb"),
    (b"a\xe0\x80\x80b", "a\ufffd\ufffd\ufffdb"),
    (b"a\xf4\x90\x80\x80b", "a\ufffd\ufffd\ufffd\ufffdb"),
    (b"a\xf0\x9f\x98", "a\ufffd"),
    (b"\xe2\x82\xe2\x82\xac", "\ufffd\u20ac"),
]


@pytest.mark.parametrize("data, java", JAVA_DECODED)
def test_bytes_that_are_not_utf8_read_as_javas_decoder_replaces_them(data, java):
    assert LineFormat().records(data + b"\n").to_pylist() == [java]
    assert LineFormat(wholetext=True).records(data).to_pylist() == [java]


def test_a_checkpoint_counted_with_rules_1_reads_its_upper_case_gz_as_counted_and_new_ones_decompressed(tmp_path):
    inp, ck = tmp_path / "in", tmp_path / "ck"
    raw = gzip.compress(b"g1\ng2\n", mtime=0)
    write(inp / "r" / "old.GZ", raw)
    st = (inp / "r" / "old.GZ").stat()
    counted = LineFormat().for_rules(1).count(raw)  # the raw bytes' lines, as regional counted them then
    Store(ck).source_log("files").write_snapshot({
        "source": "files", "path": str(inp), "rules": 1, "format": {"lineSep": None, "wholetext": False},
        "regions": {"r": {"end": counted, "next": 1, "files": [[0, "old.GZ", 0, counted, len(raw), st.st_ino,
                                                                   st.st_mtime_ns, hashlib.sha256(raw).hexdigest()[:32],
                                                                   False]]}}})
    commit(ck, 0, {"r": 0})
    write(inp / "r" / "new.GZ", gzip.compress(b"n1\n", mtime=0))
    s = source(inp, ck)
    assert s.available(1) == {"r": counted + 1}
    assert read_all(s, "r", counted, counted + 1) == ["n1"]
    assert len(read_all(s, "r", 0, counted)) == counted  # as counted: its offsets keep naming the same records
    s2 = source(inp, ck)  # a restart: the manifest it wrote since keeps each file's rules
    assert s2.available(2) == {"r": counted + 1}
    assert len(read_all(s2, "r", 0, counted + 1)) == counted + 1


def test_an_upper_case_compressed_rotation_is_a_rotation():
    from regional.inputs.files.manifest import rotation_of

    assert rotation_of("app.log", "app.log.2.GZ") and rotation_of("x.log", "x.log.Bz2")
    assert not rotation_of("app.log", "other.log.GZ")


def test_zero_padding_after_gzip_data_is_read_other_trailing_bytes_fail_naming_the_codec():
    """Issue 59, item 8, a deliberate difference (docs/sources/files.md): zeros after the last gzip member (block
    padding) are read past, as gunzip and Python read them, where Spark's text source fails the read; any other
    bytes there are a corrupt file, as in Spark."""
    import gzip

    from regional.inputs.files.lines import CorruptFile, decompress

    assert decompress("gzip", gzip.compress(b"a\nb\n") + b"\0" * 512) == b"a\nb\n"
    with pytest.raises(CorruptFile, match="not valid gzip data"):
        decompress("gzip", gzip.compress(b"a\n") + b"garbage")


@pytest.mark.parametrize("ext", [".gz", ".bz2", ".zst", ".deflate", ".lz4", ".snappy", ".ZST"])
def test_an_empty_compressed_file_holds_no_records_and_wholetext_of_compressed_nothing_is_one(ext, tmp_path):
    """Found by the random inputs against spark.read.text (integration/files_generator.py, issue 59): a file of 0
    bytes named as a compressed file is no records in Spark, whatever its codec (regional refused an empty .zst
    as corrupt, failing the query); with wholetext=true, a compressed file whose content is empty is one empty
    record in Spark (its bytes on disk are not none), and regional read none."""
    import bz2
    import zlib

    import zstandard

    inp, ck = tmp_path / "in", tmp_path / "ck"
    write(inp / "r" / f"empty{ext}", b"")
    s = source(inp, ck)
    assert s.available(0) == {"r": 0}
    packed = {".gz": gzip.compress(b""), ".bz2": bz2.compress(b""), ".deflate": zlib.compress(b""),
              ".zst": zstandard.ZstdCompressor().compress(b""), ".ZST": zstandard.ZstdCompressor().compress(b"")}
    if ext in packed:
        inp2, ck2 = tmp_path / "in2", tmp_path / "ck2"
        write(inp2 / "r" / f"nothing{ext}", packed[ext])
        write(inp2 / "r" / f"zero{ext}", b"")
        whole = source(inp2, ck2, wholetext="true")
        assert whole.available(0) == {"r": 1}
        assert read_all(whole, "r", 0, 1) == [""]
        assert source(inp2, tmp_path / "ck3").available(0) == {"r": 0}  # lines: none, as Spark
