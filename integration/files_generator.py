"""Random inputs for ``source=files`` compared with ``spark.read.text``, the reference (issue 59, third pass).

Each case is a small directory tree of files (``<root>/<case>/r/...``): lines broken by ``\\n``, ``\\r\\n``, a lone
``\\r`` or the separators of every ``lineSep`` tried (``|``, ``||``, ``\\n\\n``, ``aab``, ``é``), empty lines, a last
line with or without its break, byte-order marks (at the start and elsewhere), bytes that are not UTF-8 (cut
sequences, UTF-8-encoded surrogates, overlong forms), each file plain or compressed (gzip, with several members or
not; bzip2; zstd; zlib's ``.deflate``; Hadoop's LZ4 and Snappy block framing), its extension in any case
(``.GZ``, ``.Gz``), in plain, ``key=value`` and hidden (``_x``, ``.x``, ``._COPYING_``) directories or names.

One option set's cases are read by ONE ``spark.read.text`` call over their root (``recursiveFileLookup``, each
row's ``_metadata.file_path`` giving its file) and by ONE regional files source over the same root, as a query's
driver and tasks read it (``available``: the listing, hidden names, codecs, each file's lines counted from its
bytes; ``split`` and ``read``: the task's records). Each case's region is compared record by record, file by file,
in regional's order. A case whose files Spark cannot read fails its read; then the cases are read again in halves
until the failing ones are found, and regional must refuse them too.

The fast subset runs in the normal suite (``integration/test_files_generator.py``); the long campaign is::

    .venv/bin/python -m integration.files_generator --cases 5000 --seed 7

(``--cases`` per option set; it prints each mismatch, with the file's bytes, and exits 1 if there is one).
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import random
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

BOM = b"\xef\xbb\xbf"
EDGE = 64 * 1024  # Hadoop's LineReader buffer
OPTION_SETS: list[dict[str, str]] = [
    {}, {"lineSep": "|"}, {"lineSep": "||"}, {"lineSep": "\n\n"}, {"lineSep": "\r\n"}, {"lineSep": "\n"},
    {"lineSep": "aab"}, {"lineSep": "é"}, {"wholetext": "true"},
]
WORDS = [b"a", b"b", b"xyz", "é".encode(), "€".encode(), "𝄞".encode(), b" ", b"\t", b"0", b"=", b"\x00"]
BREAKS = [b"\n", b"\r", b"\r\n", b"\n\r", b"|", b"||", b"\n\n", b"aab", b"aa", "é".encode(), b"\r\r\n"]
BAD = [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xed\xa0", b"\xed\xbf\xbf", b"\xe2\x82", b"\xf4\x90\x80\x80",
       b"\xc3", b"\xe0\x80\x80", b"\x80", b"\xed\x9f\xbf", b"\xf0\x9f", BOM]
DIRECTORIES = ["", "", "", "sub/", "k=v/", "a/b=2/", "date=2026-11-29/h=01/", "_k=v/", "x y/"]
HIDDEN = ["_tmp/", ".staging/", "sub/_x/"]
# Spark lists a root of thousands of case directories on the driver, not in a job of its own (the same files)
LISTING = {"spark.sql.sources.parallelPartitionDiscovery.threshold": "1000000"}
timing: dict[str, float] = {}  # seconds spent reading, by side (the campaign prints it)
CODECS = ["", "", "", ".gz", ".gz", ".bz2", ".zst", ".deflate", ".lz4", ".snappy"]


def text(rng: random.Random, long_lines: bool) -> bytes:
    """A file's content: words, breaks of every kind, bad bytes; a BOM first or not; a last break or not."""
    shape = rng.random()
    if shape < 0.05:
        return b""
    if shape < 0.12:  # separators and breaks alone
        return b"".join(rng.choice([*BREAKS, b"\r", b"\n"]) for _ in range(rng.randint(1, 6)))
    out = [BOM] if rng.random() < 0.2 else []
    for _ in range(rng.randint(1, 25)):
        kind = rng.random()
        if kind < 0.3:
            out.append(rng.choice(BREAKS))
        elif kind < 0.4:
            out.append(rng.choice(BAD))
        elif kind < 0.41 and long_lines:
            out.append(b"L" * rng.randint(EDGE - 4, EDGE + 2))  # a break at the reader's buffer edge
        else:
            out.append(rng.choice(WORDS) * rng.randint(1, 3))
    if rng.random() < 0.5:
        out.append(rng.choice(BREAKS))
    return b"".join(out)


def _hadoop_blocks(data: bytes, compress: Callable[[bytes], bytes], rng: random.Random) -> bytes:
    """Hadoop's BlockCompressorStream framing, as Spark's lz4 and snappy codecs write and read it: per block, its
    decompressed length, then its compressed chunks, each with its length (4 bytes, big-endian)."""
    out, at = [], 0
    while at < len(data):
        block = data[at:at + rng.choice([len(data), 7, 100, 1 << 16])]
        at += len(block)
        chunk = compress(block)
        out += [len(block).to_bytes(4, "big"), len(chunk).to_bytes(4, "big"), chunk]
    return b"".join(out)


def compress(ext: str, data: bytes, rng: random.Random) -> bytes:
    """``data`` as a file with extension ``ext`` (lower case) holds it; sometimes several members/streams/frames."""
    if not ext:
        return data
    cut = rng.randint(0, len(data)) if rng.random() < 0.3 else len(data)
    parts = [data[:cut], data[cut:]] if cut < len(data) else [data]
    if ext == ".gz":
        return b"".join(gzip.compress(p, mtime=0) for p in parts)
    if ext == ".bz2":
        return b"".join(bz2.compress(p) for p in parts)
    if ext == ".deflate":
        return b"".join(zlib.compress(p) for p in parts)
    if ext == ".zst":
        import zstandard

        return b"".join(zstandard.ZstdCompressor().compress(p) for p in parts)
    import cramjam

    if ext == ".lz4":
        return _hadoop_blocks(data, lambda b: bytes(cramjam.lz4.compress_block(b, store_size=False)), rng)
    assert ext == ".snappy"
    return _hadoop_blocks(data, lambda b: bytes(cramjam.snappy.compress_raw(b)), rng)


def any_case(ext: str, rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.7:
        return ext
    if roll < 0.85:
        return ext.upper()
    return "".join(c.upper() if rng.random() < 0.5 else c for c in ext)


def case_files(rng: random.Random, long_lines: bool = False) -> dict[str, bytes]:
    """One case: path under its region -> bytes on disk. Some files hidden (neither side reads them)."""
    files: dict[str, bytes] = {}
    for j in range(rng.choice([1, 1, 1, 2, 3])):
        ext = rng.choice(CODECS)
        name = f"{rng.choice(DIRECTORIES)}f{j}.{rng.choice(['txt', 'log', 'csv'])}{any_case(ext, rng)}"
        files[name] = compress(ext, text(rng, long_lines), rng)
    if rng.random() < 0.15:
        hidden = rng.choice([f"{rng.choice(HIDDEN)}h.txt", "_h.txt", ".h.txt", "h.txt._COPYING_"])
        files[hidden] = b"hidden\n"
    return files


@dataclass
class Mismatch:
    case: str
    file: str
    options: dict[str, str]
    regional: list[str] | str  # records, or the error it raised
    spark: list[str] | str
    data: bytes = b""

    def __str__(self) -> str:
        return (f"case {self.case} file {self.file!r} options {self.options}: regional {self.regional!r}, "
                f"spark.read.text {self.spark!r}; bytes {self.data[:300]!r}")


@dataclass
class Outcome:
    cases: int = 0
    files: int = 0
    records: int = 0
    refused: int = 0  # cases both sides refuse (a file Spark cannot read)
    # the deliberate difference (docs/sources/files.md): Spark did not split at a lineSep occurrence of 3 bytes or
    # more that straddles its reader's buffer, where regional split (``hadoop_missed_separators``)
    missed: list[Mismatch] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)


def hadoop_missed_separators(ours: list[str], theirs: list[str], options: dict[str, str]) -> bool:
    """Whether Spark's records are regional's with some consecutive ones joined again by ``lineSep``: the
    occurrences Hadoop's ``LineReader`` misses when a separator whose own prefix repeats (``aab``: after ``aa``,
    an ``a`` must go back one byte) straddles its read buffer (a 64 KiB read, or a gzip member's or an LZ4 block's
    end) and it would have to go back into the buffer before. Only separators of 3 bytes or more can be missed so."""
    sep = options.get("lineSep")
    if sep is None or len(sep.encode()) < 3 or len(theirs) >= len(ours):
        return False
    at = 0
    for record in theirs:
        joined = None
        while at < len(ours):
            joined = ours[at] if joined is None else joined + sep + ours[at]
            at += 1
            if joined == record:
                break
        if joined != record:
            return False
    return at == len(ours)


def write_cases(root: Path, seed: int, n: int, long_lines: bool = False) -> dict[str, dict[str, bytes]]:
    rng = random.Random(seed)
    cases = {}
    for i in range(n):
        case = f"c{i:05d}"
        cases[case] = case_files(rng, long_lines)
        for name, data in cases[case].items():
            path = root / case / "r" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return cases


def spark_read(spark: Any, root: Path, cases: list[str], options: dict[str, str]) -> dict[str, Any]:
    """Each case's records as ``spark.read.text`` reads them: {case: {path under the region: [values]}}, or
    {case: "error"} for the cases whose read fails (found by reading again in halves)."""
    reader = spark.read.option("recursiveFileLookup", "true")
    for k, v in options.items():
        if k != "wholetext":  # (text() sets wholetext itself: given as its argument)
            reader = reader.option(k, v)
    try:
        paths = [str(root)] if len(cases) > 1 and len(cases) == len(list(root.iterdir())) \
            else [str(root / c) for c in cases]
        frame = reader.text(paths, wholetext=options.get("wholetext") == "true")
        rows = frame.select("value", "_metadata.file_path").collect()
    except Exception as exc:
        if len(cases) == 1:
            return {cases[0]: f"fails: {str(exc).splitlines()[0][:200]}"}
        half = len(cases) // 2
        return {**spark_read(spark, root, cases[:half], options), **spark_read(spark, root, cases[half:], options)}
    out: dict[str, Any] = {c: {} for c in cases}
    for value, uri in rows:
        rel = Path(unquote(urlparse(uri).path)).resolve().relative_to(root.resolve())
        case, name = rel.parts[0], "/".join(rel.parts[2:])
        out[case].setdefault(name, []).append(value)
    return out


def _source(path: Path, ck: Path, options: dict[str, str]) -> Any:
    """A files source as a query's driver makes it (``.load()``: its columns decided; then its store)."""
    from regional.inputs import files
    from regional.store import Store

    source = files.create({"path": str(path), "recursiveFileLookup": "true", **options})
    source.decide_schema()
    source.use_store(Store(str(ck)))
    return source


def regional_read(path: Path, ck: Path, options: dict[str, str], rng: random.Random) -> dict[str, Any]:
    """Each region's records as regional reads them: {region: {file: [values]}}, files in offset order. The
    driver's count (``available``) and the task's records (``read``, which checks it against the count) are both
    exercised; each file's count over random chunks is checked against it too."""
    from regional.inputs.files.lines import LineFormat

    source = _source(path, ck, options)
    ends = source.available(0)
    fmt: LineFormat = source.format
    out: dict[str, Any] = {}
    for region, end in ends.items():
        spans = source.split(region, 0, end)
        per_file: dict[str, list[str]] = {}
        for span in spans:
            raw = (path / region / span.name).read_bytes()
            cuts = sorted(rng.sample(range(len(raw) + 1), k=min(len(raw) + 1, 3)))
            chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
            counted = fmt.fingerprint(span.name, iter(chunks))[1]
            if counted != span.lines:
                per_file[span.name] = [f"<counted {counted} over chunks, {span.lines} whole>"]
                continue
            batches = source.read(region, span.first_offset, span.end, [span])
            per_file[span.name] = [v for b in batches for v in b.column("value").to_pylist()]
        # files with no records: listed, but no span needs reading
        for span in source.manifest()[region].files.values():
            per_file.setdefault(span.name, [])
        out[region] = per_file
    return out


def compare(spark: Any, work: Path, seed: int, n: int, options: dict[str, str],
            long_lines: bool = False) -> Outcome:
    """``n`` cases of seed ``seed`` read with ``options`` by both sides, compared."""
    root, ck = work / "in", work / "ck"
    cases = write_cases(root, seed, n, long_lines)
    rng = random.Random(seed + 1)
    began = time.monotonic()
    theirs = spark_read(spark, root, sorted(cases), options)
    timing["spark"] = timing.get("spark", 0.0) + time.monotonic() - began
    began = time.monotonic()
    failing = sorted(c for c, v in theirs.items() if isinstance(v, str))
    ours: dict[str, Any] = {}
    try:
        if failing:
            raise RuntimeError("per case")  # a case Spark cannot read: each case on its own
        ours = {case: files for case, files in regional_read(root, ck, options, rng).items()}
        ours = {case: {n.removeprefix("r/"): v for n, v in files.items()} for case, files in ours.items()}
    except Exception as exc:
        if not failing:
            raise AssertionError(f"regional refused a set of cases Spark reads: {exc}") from exc
        for case in sorted(cases):
            try:
                found = regional_read(root / case, work / f"ck-{case}", options, rng)
                ours[case] = found.get("r", {})
            except Exception as exc2:
                ours[case] = f"fails: {type(exc2).__name__}: {str(exc2)[:200]}"
    timing["regional"] = timing.get("regional", 0.0) + time.monotonic() - began
    outcome = Outcome(cases=len(cases))
    for case in sorted(cases):
        mine, spark_side = ours.get(case, {}), theirs[case]
        if isinstance(spark_side, str) or isinstance(mine, str):
            if isinstance(spark_side, str) and isinstance(mine, str):
                outcome.refused += 1
            else:
                outcome.mismatches.append(Mismatch(case, "*", options, mine, spark_side,
                                                   b"|".join(cases[case].values())))
            continue
        names = [n for n in mine]  # regional's order; a file only Spark reads is a mismatch too
        names += sorted(n for n in spark_side if n not in mine)
        for name in names:
            got, want = mine.get(name, "<not read>"), spark_side.get(name, [])
            if mine.get(name) == [] and name not in spark_side:
                want = []
            outcome.files += 1
            if got != want and isinstance(got, list) and hadoop_missed_separators(got, want, options):
                outcome.missed.append(Mismatch(case, name, options, got, want, cases[case].get(name, b"")))
            elif got != want:
                outcome.mismatches.append(Mismatch(case, name, options, got, want, cases[case].get(name, b"")))
            elif isinstance(got, list):
                outcome.records += len(got)
    return outcome


def campaign(spark: Any, work: Path, seed: int, n: int, option_sets: list[dict[str, str]],
             long_lines: bool, report: Callable[[str], None]) -> list[Outcome]:
    outcomes = []
    for i, options in enumerate(option_sets):
        where = work / f"set{i}"
        outcome = compare(spark, where, seed + i, n, options, long_lines)
        shutil.rmtree(where, ignore_errors=True)
        report(f"{options}: {outcome.cases} cases, {outcome.files} files, {outcome.records} records, "
               f"{outcome.refused} refused by both, {len(outcome.missed)} files where Spark missed a lineSep "
               f"across its buffer (a listed difference), {len(outcome.mismatches)} mismatches")
        for m in outcome.missed[:3]:
            report(f"  missed by Spark (listed): {m}")
        for m in outcome.mismatches[:20]:
            report(f"  MISMATCH {m}")
        outcomes.append(outcome)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.files_generator", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000, help="cases per option set")
    parser.add_argument("--seed", type=int, default=59)
    parser.add_argument("--long-lines", action="store_true", help="some lines at Hadoop's 64 KiB buffer edge")
    args = parser.parse_args(argv)
    import regional

    spark = regional.local_spark("local[2]", "regional-files-generator", LISTING)
    try:
        with tempfile.TemporaryDirectory(prefix="regional-files-generator-") as tmp:
            outcomes = campaign(spark, Path(tmp), args.seed, args.cases, OPTION_SETS, args.long_lines, print)
    finally:
        spark.stop()
    print(f"seconds reading: {timing}")
    total = sum(o.cases for o in outcomes)
    bad = sum(len(o.mismatches) for o in outcomes)
    missed = sum(len(o.missed) for o in outcomes)
    print(f"seed {args.seed}: {total} cases, {sum(o.files for o in outcomes)} files, "
          f"{sum(o.records for o in outcomes)} records over {len(outcomes)} option sets: {bad} mismatches, "
          f"{missed} files with the listed lineSep difference")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
