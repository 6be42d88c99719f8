"""source=files reads what Spark's text source reads (issue 46): the same adversarial files through a real regional
query (Trigger.AvailableNow into a Delta table, read back with deltalake and delta-spark) and through
``spark.read.text``, the reference, compared record by record: values and their order, file by file, in the
region's arrival order. Line breaks (``\\n``, ``\\r\\n``, a lone ``\\r``, at Hadoop's 64 KiB buffer edges), byte-order
marks, empty and long lines, every codec (``.lz4`` and ``.snappy`` written by Spark itself), nested and partition
directories, hidden names, files arriving late (sorting before processed ones), ``lineSep`` and ``wholetext``.
Then what the source refuses, and its advice followed: nothing lost, nothing doubled. Partition directories
(issue 59, item 7): the columns, types and values Spark's partition discovery gives a region's directory, and each
deliberate difference with Spark's side measured."""

from __future__ import annotations

import bz2
import datetime
import decimal
import gzip
import os
import random
import zlib
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import zstandard

import regional
from integration.helpers import assert_exactly_once_in_order, error_of, run_epochs, table_rows
from regional.errors import RegionalConfigError
from regional.inputs import files

SEED = 46
EDGE = 64 * 1024  # Hadoop's LineReader reads 64 KiB at a time (io.file.buffer.size)
BREAKS = [b"\n", b"\r\n", b"\r"]
WORDS = ["a", "b", "é", "€", "𝄞", " ", "x|y", "\t", ",", "0"]


def write(path: Path, data: bytes) -> None:
    """A writer's way: a hidden name, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, path)


def random_text(rng: random.Random, lines: int) -> bytes:
    """Lines of random words (some empty, some long), each ended by a random break; a BOM first, or not; a last
    line without a break, or not."""
    out = [b"\xef\xbb\xbf"] if rng.random() < 0.3 else []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.15:
            line = ""
        elif kind < 0.2:
            line = "L" * rng.randint(EDGE - 3, EDGE + 3)  # its break lands at the reader's buffer edge
        else:
            line = "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
        out += [line.encode(), rng.choice(BREAKS)]
    if out and rng.random() < 0.4:
        out.pop()  # no final break
    return b"".join(out)


def edge_files() -> dict[str, bytes]:
    """A \\r or \\r\\n straddling the 64 KiB buffer edge, and the smallest files."""
    files = {}
    for at in (EDGE - 2, EDGE - 1, EDGE, EDGE + 1):
        files[f"cr-{at}.txt"] = b"x" * at + b"\r\ny\rz"
        files[f"lone-cr-{at}.txt"] = b"x" * at + b"\r" + b"w\n"
    files.update({"empty.txt": b"", "bom-only.txt": b"\xef\xbb\xbf", "newline.txt": b"\n", "cr.txt": b"\r",
                  "bom-cr.txt": b"\xef\xbb\xbf\r\nq", "two-boms.txt": b"\xef\xbb\xbfa\n\xef\xbb\xbfb"})
    return files


def spark_compressed(spark, tmp: Path, codec: str, text: str) -> bytes:
    """``text``'s lines compressed by Spark's own text writer with ``codec`` (Hadoop's block framing for lz4 and
    snappy), as the bytes of the one file it writes."""
    lines = text.split("\n")
    out = tmp / f"spark-{codec}-{random.random()}"
    spark.createDataFrame([(v,) for v in lines], "value string").coalesce(1).write.option(
        "compression", codec).text(str(out))
    (part,) = [p for p in out.iterdir() if p.name.startswith("part-")]
    return part.read_bytes()


def layout(spark, root: Path, tmp: Path, rng: random.Random) -> dict[str, dict[str, bytes]]:
    """The first files: region -> path under it -> bytes."""
    regions: dict[str, dict[str, bytes]] = {"plain": {}, "nested": {}, "codecs": {}, "edges": edge_files()}
    for i in range(4):
        regions["plain"][f"{i:04d}.txt"] = random_text(rng, rng.randint(0, 30))
    regions["nested"].update({
        "top.txt": random_text(rng, 5),
        "sub/a.txt": random_text(rng, 5),
        "sub/deeper/b.txt": random_text(rng, 5),
        "date=2026-11-26/part-0.txt": random_text(rng, 5),  # a partition directory: read, its value not a column
        "date=2026-11-26/hour=01/part-0.txt": random_text(rng, 5),
    })
    text = random_text(rng, 40)
    plain_lines = "".join(rng.choice(WORDS) + "\n" for _ in range(40)).encode()
    regions["codecs"].update({
        "f.txt.gz": gzip.compress(text[: len(text) // 2]) + gzip.compress(text[len(text) // 2:]),  # two members
        "f.txt.bz2": bz2.compress(random_text(rng, 30)),
        "f.txt.deflate": zlib.compress(random_text(rng, 30)),
        "f.txt.zst": zstandard.ZstdCompressor().compress(text) + zstandard.ZstdCompressor().compress(b"z\r\n"),
        "spark.txt.lz4": spark_compressed(spark, tmp, "lz4", plain_lines.decode()),
        "spark.txt.snappy": spark_compressed(spark, tmp, "snappy", random_text(rng, 20).replace(b"\r", b"")
                                             .decode()),
        "spark.txt.gz": spark_compressed(spark, tmp, "gzip", plain_lines.decode()),
        # codecs' extensions in upper or mixed case: Spark decompresses them (issue 59)
        "upper.log.GZ": gzip.compress(b"G1\nG2\r\nG3"),
        "mixed.log.Bz2": bz2.compress(b"B1\nB2\n"),
        "upper.log.ZST": zstandard.ZstdCompressor().compress(b"Z1\n"),
    })
    # bytes that are not UTF-8, each as Java's decoder replaces it for Spark: UTF-8-encoded surrogates (one U+FFFD
    # each in Java, three in Python's "replace"), alone, paired, cut short, then other malformed sequences
    regions["edges"]["surrogates.txt"] = (b"a\xed\xa0\x80b\n\xed\xbf\xbf\n\xed\xa0\xbd\xed\xb8\x80\n"
                                          b"x\xed\xa0\ny\xed\xa0z\n\xc0\xaf\xe0\x80\x80\xf4\x90\x80\x80\xe2\x82\xff\n"
                                          b"\xed\x9f\xbf\xed\xa0")
    return regions


def hidden(root: Path) -> None:
    """Names Spark's listing leaves out: never read (and a file written under one is not yet input)."""
    write(root / "plain" / "_tmp" / "x.txt", b"hidden directory\n")
    write(root / "plain" / ".staging" / "y.txt", b"hidden directory\n")
    write(root / "nested" / "sub" / "_partial.txt", b"hidden file\n")
    write(root / "nested" / "sub" / "c.txt._COPYING_", b"a copy under way\n")


def late(rng: random.Random) -> dict[str, dict[str, bytes]]:
    """Files arriving after the first run, some sorting before processed ones, some in new directories."""
    return {
        "plain": {"0000-early.txt": random_text(rng, 10), "9999.txt": random_text(rng, 3)},
        "nested": {"date=2026-11-25/part-9.txt": random_text(rng, 4), "aaa/new.txt": random_text(rng, 4)},
        "codecs": {"e.txt.gz": gzip.compress(random_text(rng, 8))},
        "edges": {"after.txt": b"\r\r\n\n"},
    }


def spark_records(spark, paths: list[Path], **options) -> dict[Path, list[str]]:
    """What ``spark.read.text`` makes of each file, in order (the reference), in one job: a small file is one split,
    read in order, and ``collect`` keeps the order of the splits and of their rows."""
    reader = spark.read.option("recursiveFileLookup", "true")  # explicit files: no partition inference
    rows = reader.text([str(p) for p in paths], **options).select("value", "_metadata.file_path").collect()
    found: dict[Path, list[str]] = {p.resolve(): [] for p in paths}
    for value, uri in rows:
        found[Path(unquote(urlparse(uri).path)).resolve()].append(value)
    return found


def expected(spark, root: Path, arrivals: list[dict[str, dict[str, bytes]]], **options) -> dict[str, list[str]]:
    """Each region's records as Spark reads its files, the files in arrival order (those of one listing by
    their path under the region)."""
    order = [(region, root / region / name) for batch in arrivals for region, files in batch.items()
             for name in sorted(files)]
    records = spark_records(spark, [p for _r, p in order], **options)
    out: dict[str, list[str]] = {region: [] for region, _p in order}
    for region, path in order:
        out[region].extend(records[path.resolve()])
    return out


def run_available_now(spark, inp: Path, out: Path, ck: Path, **options: str) -> None:
    """One Trigger.AvailableNow run. A Python worker that could not connect back to Spark in time (a machine
    overloaded: not the source's doing) is started again, on the same checkpoint, as a user would restart it."""
    for attempt in range(3):
        try:
            return _run_available_now(spark, inp, out, ck, **options)
        except Exception as exc:
            if "Python worker failed to connect back" not in str(exc) or attempt == 2:
                raise


def _run_available_now(spark, inp: Path, out: Path, ck: Path, **options: str) -> None:
    reader = (spark.readStream.format("regional").option("source", "files").option("path", str(inp))
              .option("checkpointLocation", str(ck)))
    if "schema" in options:  # the user's schema (partition columns), not an option
        options = dict(options)
        reader = reader.schema(options.pop("schema"))
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (reader.load().writeStream.format("regional").option("target", "delta").option("path", str(out))
             .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(600)
        assert query.exception() is None, query.exception()
    finally:
        query.stop()


def landed(out: Path) -> dict[str, list[str]]:
    rows = sorted(table_rows(out))
    found: dict[str, list[str]] = {}
    for region, offset, value in rows:
        assert offset == len(found.setdefault(region, [])), (region, offset)  # dense, once each
        found[region].append(value)
    return found


def assert_same(got: dict[str, list[str]], want: dict[str, list[str]]) -> None:
    assert sorted(got) == sorted(want)
    for region in want:
        g, w = got[region], want[region]
        first = next((i for i, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), min(len(g), len(w)))
        assert g == w, (f"region {region!r}: {len(g)} records, Spark {len(w)}; first difference at {first}: "
                        f"{[v[:40] for v in g[first:first + 3]]} vs {[v[:40] for v in w[first:first + 3]]}")


def test_the_same_records_as_spark_read_text_file_by_file_in_arrival_order(spark, tmp_path):
    rng = random.Random(SEED)
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    first = layout(spark, inp, tmp_path, rng)
    for region, written in first.items():
        for name, data in written.items():
            write(inp / region / name, data)
    hidden(inp)
    run_available_now(spark, inp, out, ck, recursiveFileLookup="true")
    assert_same(landed(out), expected(spark, inp, [first]))
    second = late(rng)
    for region, written in second.items():
        for name, data in written.items():
            write(inp / region / name, data)
    run_available_now(spark, inp, out, ck, recursiveFileLookup="true")
    want = expected(spark, inp, [first, second])
    assert_same(landed(out), want)
    assert_exactly_once_in_order(out, want, spark)  # delta-spark reads the same rows


@pytest.mark.parametrize("options", [{"lineSep": "|"}, {"lineSep": "\r\n"}, {"wholetext": "true"}, {"lineSep": "||"},
                                     {"lineSep": "\n\n"}],
                         ids=["lineSep-bar", "lineSep-crlf", "wholetext", "lineSep-overlapping-bars",
                              "lineSep-overlapping-newlines"])
def test_line_sep_and_wholetext_as_spark_read_text(spark, tmp_path, options):
    rng = random.Random(SEED + len(str(options)))
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    files = {f"{i}.txt": random_text(rng, rng.randint(0, 12)).replace(b"\r", rng.choice([b"|", b"\r"]))
             for i in range(5)}
    files.update({"bom.txt": b"\xef\xbb\xbfa|b\r\nc", "empty.txt": b"", "only-sep.txt": b"|", "crlf.txt": b"\r\n",
                  "z.txt.gz": gzip.compress(b"\xef\xbb\xbfg|h\r\ni\n")})
    if options.get("lineSep") in ("||", "\n\n"):  # a separator that can overlap itself, at files' ends (issue 59)
        sep = options["lineSep"].encode()
        files.update({"runs.txt": b"rec1\nl2" + sep + b"rec2" + sep * 2 + sep[:1], "odd.txt": b"a" + sep + sep[:1],
                      "three.txt": sep + sep[:1], "four.txt": b"x" + sep * 2, "mid.txt": b"p" + sep + sep[:1] + b"q",
                      "w.txt.GZ": gzip.compress(b"u" + sep + sep[:1])})
    for name, data in files.items():
        write(inp / "r" / name, data)
    run_available_now(spark, inp, out, ck, **options)
    reference = {k: (v == "true" if k == "wholetext" else v) for k, v in options.items()}
    assert_same(landed(out), expected(spark, inp, [{"r": files}], **reference))


def test_logrotate_compress_and_delaycompress_reads_nothing_twice(spark, tmp_path):
    """app.log -> app.log.1 -> app.log.2.gz (a compressed copy; app.log.2 then deleted) -> app.log.3.gz: each
    line once. Spark's file source would read app.log.2.gz again as a new file."""
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    log = inp / "r"
    days = {d: [f"day{d}-{i}" for i in range(5)] for d in range(4)}

    def text(d: int) -> bytes:
        return "".join(v + "\n" for v in days[d]).encode()

    write(log / "app.log", text(0))
    run_available_now(spark, inp, out, ck)
    os.rename(log / "app.log", log / "app.log.1")  # rotation 1: delaycompress keeps app.log.1 plain
    write(log / "app.log", text(1))
    run_available_now(spark, inp, out, ck)
    os.rename(log / "app.log.1", log / "app.log.2")  # rotation 2: app.log.2 is compressed, then removed
    os.rename(log / "app.log", log / "app.log.1")
    write(log / "app.log.2.gz", gzip.compress((log / "app.log.2").read_bytes()))
    write(log / "app.log", text(2))
    run_available_now(spark, inp, out, ck)  # app.log.2 and app.log.2.gz both there
    (log / "app.log.2").unlink()
    run_available_now(spark, inp, out, ck)
    os.rename(log / "app.log.2.gz", log / "app.log.3.gz")  # rotation 3
    os.rename(log / "app.log.1", log / "app.log.2")
    os.rename(log / "app.log", log / "app.log.1")
    write(log / "app.log.2.gz", gzip.compress((log / "app.log.2").read_bytes()))
    (log / "app.log.2").unlink()
    write(log / "app.log", text(3))
    run_available_now(spark, inp, out, ck)
    assert_exactly_once_in_order(out, {"r": [v for d in range(4) for v in days[d]]}, spark)


def test_what_is_refused_and_where_its_advice_leads(spark, tmp_path):
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    write(inp / "r" / "a.txt", b"a1\na2\n")
    # each start is a few Python processes: the rest of the refusals is tests/test_files_lines.py's, without Spark
    for options, says in [({"encoding": "UTF-16"}, "only UTF-8 files are read")]:
        message = error_of(lambda o=options: run_available_now(spark, inp, out, ck, **o))
        assert says in message, message[-2000:]
    run_available_now(spark, inp, out, ck, encoding="utf8")  # UTF-8 under any of its names
    write(inp / "loose.txt", b"directly under path\n")
    message = error_of(lambda: run_available_now(spark, inp, out, ck))
    assert "'loose.txt' is a file directly under path" in message, message[-2000:]
    os.rename(inp / "loose.txt", inp / "r" / "loose.txt")  # the advice: into a region
    write(inp / "r" / "date=2026-11-26" / "p.txt", b"p1\n")
    message = error_of(lambda: run_available_now(spark, inp, out, ck))
    assert "show different partition directories" in message and "recursiveFileLookup" in message
    write(inp / "r" / "bad.gz", b"this is not gzip\n")
    message = error_of(lambda: run_available_now(spark, inp, out, ck, recursiveFileLookup="true"))
    assert "bad.gz is not valid gzip data" in message and "Move it out of path" in message, message[-2000:]
    os.rename(inp / "r" / "bad.gz", inp / "r" / ".bad.gz")  # the advice: out of sight, then written again whole
    write(inp / "r" / "good.gz", gzip.compress(b"g1\ng2\n"))
    run_available_now(spark, inp, out, ck, recursiveFileLookup="true")
    message = error_of(lambda: run_available_now(spark, inp, out, ck, recursiveFileLookup="true", lineSep="|"))
    assert "counted the lines of its files with the default line breaks" in message, message[-2000:]
    assert "new checkpointLocation and a new, empty target" in message
    want = {"r": ["a1", "a2", "p1", "g1", "g2", "directly under path"]}  # one listing: by path under the region
    assert_exactly_once_in_order(out, want, spark)
    # The advice followed: a new checkpoint and a new target read everything once; the old table is as it was.
    out2, ck2 = tmp_path / "out2", tmp_path / "ck2"
    run_available_now(spark, inp, out2, ck2, recursiveFileLookup="true", lineSep="|")
    assert_exactly_once_in_order(out, want, spark)
    assert sorted(landed(out2)["r"]) == sorted(["a1\na2\n", "directly under path\n", "p1\n", "g1\ng2\n"])


def test_a_deleted_file_s_advice_followed_loses_and_doubles_nothing(spark, tmp_path):
    """The error after a file deleted with records unpublished: put it back (the query goes on, every record
    once), or a new checkpoint and a new target (every record once there; the old table keeps what it had). Its
    old advice, a new checkpoint alone, published 40 of 40 records twice into the same table."""
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    values = [f"v{i}" for i in range(400)]
    data = "".join(v + "\n" for v in values).encode()
    write(inp / "r" / "a.txt", data)
    for attempt in range(3):  # a Python worker that could not connect back in time: started again
        query = (spark.readStream.format("regional").option("source", "files").option("path", str(inp))
                 .option("checkpointLocation", str(ck)).option("maxRecordsPerRegion", "2").load()
                 .writeStream.format("regional").option("target", "delta").option("path", str(out))
                 .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true").start())
        try:
            run_epochs(query, ck, 1)
            break
        except AssertionError as exc:
            if "Python worker failed to connect back" not in str(exc) or attempt == 2:
                raise
    published = regional.status(ck).regions["r"].committed_offset
    assert 2 <= published < 400 and len(table_rows(out)) == published
    (inp / "r" / "a.txt").unlink()
    message = ""
    for _ in range(3):  # the first listing marks it gone, the next fails (or the re-run plan finds it gone)
        message = error_of(lambda: run_available_now(spark, inp, out, ck))
        if "a.txt" in message:
            break
    assert "'a.txt' of region 'r'" in message and "Put it back" in message, message[-2000:]
    assert "new checkpointLocation and a new, empty target" in message, message[-2000:]
    before = table_rows(out)
    # The second way first (it reads what is there now, into a new table), then put it back and go on.
    write(inp / "r" / "b.txt", b"b1\n")
    out2, ck2 = tmp_path / "out2", tmp_path / "ck2"
    run_available_now(spark, inp, out2, ck2)
    assert table_rows(out) == before
    assert_exactly_once_in_order(out2, {"r": ["b1"]}, spark)
    (inp / "r" / "b.txt").unlink()
    write(inp / "r" / "a.txt", data)  # put back: same name, same content
    run_available_now(spark, inp, out, ck)
    assert_exactly_once_in_order(out, {"r": values}, spark)


# -- partition directories (issue 59, item 7) ------------------------------------------------------------------------

PARTITIONED = {  # region -> path under it -> lines; each region alone infers what the two together infer
    "us": {"d=2026-11-28/i=1/l=9999999999/m=99999999999999999999/x=1.5/s=a%20b/p-0.txt": "us0a\nus0b\n",
           "d=__HIVE_DEFAULT_PARTITION__/i=-5/l=1/m=1e3/x=NaN/s=01/p-1.txt": "us1a\r\nus1b",
           "d=2026-11-29/i=+7/l=-3/m=12/x=2/s=__HIVE_DEFAULT_PARTITION__/deeper/p-2.txt": "us2\n"},
    "eu": {"d=2026-11-29/i=0/l=5000000000/m=12345678901234567890/x=1/s=x/p-0.txt": "eu0\n",
           "d=2026-12-01/i=2147483647/l=-9999999999/m=1/x= 2.5/s=c%3Dd/p-1.txt": "eu1a\neu1b\n",
           "d=2026-12-01/i=3/l=2/m=7/x=-Infinity/s=%C3%A9 é/p-2.txt.gz": "eu2\n"},
}


def spark_partitioned(spark, root: Path, region: str) -> tuple[str, list[tuple]]:
    """What ``spark.read.text`` makes of a region's directory: its schema and its rows (value, then the partition
    columns), sorted."""
    df = spark.read.text(str(root / region))
    return df.schema.simpleString(), sorted((tuple(r) for r in df.collect()), key=repr)


def test_partition_columns_named_typed_and_valued_as_spark_partition_discovery(spark, tmp_path):
    """The same partition directories read by a regional query (into Delta, read back by delta-spark) and by
    spark.read.text on each region's directory: the same columns, types and values, record by record; then a
    later file that fits them is read, and one that does not fails the query naming its directory."""
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    for region, written in PARTITIONED.items():
        for name, text in written.items():
            write(inp / region / name, gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    run_available_now(spark, inp, out, ck)
    table = spark.read.format("delta").load(str(out))
    for region in PARTITIONED:
        schema, want = spark_partitioned(spark, inp, region)
        assert schema == ("struct<value:string,d:date,i:int,l:bigint,m:decimal(20,0),x:double,s:string>"), schema
        rows = table.where(f"region = '{region}'").drop("region", "offset")
        assert rows.schema.simpleString() == schema  # the same columns, in the same order, of the same types
        got = sorted((tuple(r) for r in rows.collect()), key=repr)
        assert repr(got) == repr(want), (region, got, want)  # repr: NaN equals NaN
    # A later file in a new partition that fits the columns: read, with its values.
    write(inp / "us" / "d=2026-12-24/i=9/l=9/m=9/x=9/s=new/p.txt", b"late\n")
    run_available_now(spark, inp, out, ck)
    late = spark.read.format("delta").load(str(out)).where("value = 'late'").drop("offset").collect()
    assert [tuple(r) for r in late] == [("us", "late", datetime.date(2026, 12, 24), 9, 9, decimal.Decimal(9), 9.0,
                                         "new")]
    # One whose value the column's type cannot hold: the query fails naming it; hidden, the query goes on.
    write(inp / "eu" / "d=2026-12-25/i=ten/l=1/m=1/x=1/s=y/p.txt", b"bad\n")
    message = error_of(lambda: run_available_now(spark, inp, out, ck))
    # (a restart: the directories now infer i STRING, and the checkpoint's i is INT)
    assert "i='ten'" in message and "i INT" in message and "i STRING" in message, message[-2000:]
    assert ".schema('region STRING, offset BIGINT, value STRING, `d` DATE, `i` INT," in message
    # Its advice: the old columns given as the schema, then the directory that does not fit them hidden.
    schema = message.split(".schema('")[1].split("')")[0]
    message = error_of(lambda: run_available_now(spark, inp, out, ck, schema=schema))
    assert "its directory i='ten' holds a value that the partition column i (INT" in message, message[-2000:]
    os.rename(inp / "eu" / "d=2026-12-25", inp / "eu" / ".d=2026-12-25")
    run_available_now(spark, inp, out, ck, schema=schema)
    assert spark.read.format("delta").load(str(out)).count() == 10


def test_where_regional_reads_partition_and_plain_directories_otherwise_than_spark(spark, tmp_path):
    """Each deliberate difference (docs/sources/files.md), Spark's side measured here on a region's directory:
    regional reads every file of a region at any depth, and refuses a layout where Spark drops files, merges
    columns or replaces the line. Regional's side is decided without a query (the schema ``.load()`` gets)."""

    def layout(name: str, files: dict[str, bytes]) -> Path:
        for path, data in files.items():
            write(tmp_path / name / "r" / path, data)
        return tmp_path / name

    def spark_reads(root: Path) -> tuple[str, list[tuple]]:
        df = spark.read.text(str(root / "r"))
        return df.schema.simpleString(), sorted(tuple(r) for r in df.collect())

    def regional_schema(root: Path) -> str:
        return files.create({"path": str(root)}).decide_schema()

    plain = layout("plain", {"top.txt": b"t\n", "sub/x.txt": b"s\n", "sub/deeper/y.txt": b"y\n"})
    assert spark_reads(plain) == ("struct<value:string>", [("t",)])  # Spark: sub-directories not read
    s = files.create({"path": str(plain)})
    assert s.decide_schema() == "region STRING, offset BIGINT, value STRING" and s.available(0) == {"r": 3}
    assert [r["value"] for b in s.read("r", 0, 3, s.split("r", 0, 3)) for r in b.to_pylist()] == ["y", "s", "t"]
    top = layout("top", {"date=2026-11-28/p.txt": b"a\n", "x.txt": b"dropped by Spark\n"})
    assert spark_reads(top) == ("struct<value:string,date:date>", [("a", datetime.date(2026, 11, 28))])
    with pytest.raises(RegionalConfigError, match="show different partition directories"):
        regional_schema(top)  # regional: refused, naming the file Spark drops
    beside = layout("beside", {"date=2026-11-28/p.txt": b"a\n", "plain/x.txt": b"x\n"})
    with pytest.raises(Exception, match="CONFLICTING_DIRECTORY_STRUCTURES"):
        spark_reads(beside)
    with pytest.raises(RegionalConfigError, match="show different partition directories"):
        regional_schema(beside)
    null = layout("null", {"n=__HIVE_DEFAULT_PARTITION__/p.txt": b"a\n"})
    assert spark_reads(null) == ("struct<value:string,n:void>", [("a", None)])
    assert regional_schema(null).endswith(", `n` STRING")  # regional: STRING (no table holds void)
    cased = layout("cased", {"Date=2026-11-28/p.txt": b"a\n", "date=2026-11-29/p.txt": b"b\n"})
    assert spark_reads(cased)[0].lower() == "struct<value:string,date:date>"  # Spark: one column, either name
    with pytest.raises(RegionalConfigError, match="give the directories one spelling"):
        regional_schema(cased)
    named = layout("named", {"value=1/p.txt": b"a line\n"})
    assert spark_reads(named) == ("struct<value:int>", [(1,)])  # Spark: the line is gone, replaced by 1
    with pytest.raises(RegionalConfigError, match="named like regional's own value column"):
        regional_schema(named)
    between = layout("between", {"date=2026-11-28/plain/h=1/p.txt": b"a\n"})
    assert spark_reads(between) == ("struct<value:string,h:int>", [("a", 1)])  # Spark: date dropped
    assert regional_schema(between).endswith(", `date` DATE, `h` INT")


def test_partition_types_at_the_edges_and_a_key_under_a_plain_directory_as_measured(spark, tmp_path):
    """Spark's side of the types review 59 corrected (docs/sources/files.md): a DECIMAL's precision counts its
    exponent (0e3), past 38 digits a DOUBLE (1e9999999999: Infinity), a "T" or no seconds is a STRING (not a
    timestamp, so not refused). And one difference kept: the same key under a plain directory in one file and
    directly in the region in another, which Spark refuses (CONFLICTING_DIRECTORY_STRUCTURES) and regional reads."""

    def spark_and_regional(name: str, paths: list[str]) -> tuple[str, str]:
        for path in paths:
            write(tmp_path / name / "r" / path, b"a\n")
        try:
            theirs = spark.read.text(str(tmp_path / name / "r")).schema.simpleString()
        except Exception as exc:  # Spark's error class is the measurement
            theirs = str(exc).split("]")[0].lstrip("[")
        return theirs, files.create({"path": str(tmp_path / name)}).decide_schema().split("value STRING")[1]

    for i, (value, theirs, ours) in enumerate([
            ("0e3", "decimal(4,0)", "DECIMAL(4,0)"), ("0e40", "double", "DOUBLE"),
            ("1e9999999999", "double", "DOUBLE"), ("2026-11-28T00:00", "string", "STRING"),
            ("2026-11-28 10%3A00", "string", "STRING")]):
        assert spark_and_regional(f"t{i}", [f"n={value}/p.txt"]) == (f"struct<value:string,n:{theirs}>",
                                                                       f", `n` {ours}"), value
    assert spark_and_regional("plain", ["n=1/p.txt", "plain/n=2/p.txt"]) == ("CONFLICTING_DIRECTORY_STRUCTURES",
                                                                              ", `n` INT")
    s = files.create({"path": str(tmp_path / "plain")})
    s.decide_schema()
    assert s.available(0) == {"r": 2}
    assert sorted(r["n"] for b in s.read("r", 0, 2, s.split("r", 0, 2)) for r in b.to_pylist()) == [1, 2]
