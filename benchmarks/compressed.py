"""Compressed input (issue 46): 16 regions of text files of about 200-byte lines, as scenario 1's, gzip-compressed
(``.txt.gz``), into Delta through regional's files source and through Spark's text source (which decompresses by
extension, as Hadoop's codecs do), side by side in scenario 1's session.
Rows/s of each, and of the uncompressed files beside them.

    python -m benchmarks.compressed --rows-per-file 50000 --files-per-region 4 --repeats 3
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import regional
from benchmarks.common import LINE_PAD, REGIONS, delta_rows, regional_query, spread, stock_query, timed, write_input
from benchmarks.run import session
from benchmarks.sections import write_section

ROOT = Path(__file__).resolve().parent.parent


def gzip_copy(plain: Path, packed: Path) -> None:
    """Every ``<region>/<n>.txt`` of ``plain`` as ``<region>/<n>.txt.gz`` under ``packed`` (gzip level 6), file
    by file across the regions as ``write_input`` writes them (stock's source goes by modification time)."""
    for f in sorted(plain.rglob("*.txt"), key=lambda f: (f.name, f.parent.name)):
        target = packed / f.parent.name / (f.name + ".gz")
        target.parent.mkdir(parents=True, exist_ok=True)
        with f.open("rb") as source, gzip.open(target, "wb", compresslevel=6) as sink:
            shutil.copyfileobj(source, sink)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compressed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows-per-file", type=int, default=50_000)
    parser.add_argument("--files-per-region", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1 (the warm-up round is not counted)")
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="regional-bench-gz-"))
    try:
        plain, packed = work / "plain", work / "packed"
        rows = write_input(plain, args.rows_per_file, args.files_per_region, LINE_PAD)
        gzip_copy(plain, packed)
        sizes = {name: sum(f.stat().st_size for f in d.rglob("*.txt*")) / 2**20 for name, d in
                 (("plain", plain), ("packed", packed))}
        spark = session()  # scenario 1's: 4 GB for the driver, which both pipelines share
        regional.register(spark)
        spark.sparkContext.setLogLevel("OFF")
        rates: dict[str, list[float]] = {}
        for i in range(args.repeats + 1):  # run 0 warms the JVM and the workers up; it is not counted
            for name, inp, files in (("stock .gz", packed, "*.txt.gz"), ("regional .gz", packed, None),
                                     ("stock .txt", plain, "*.txt"), ("regional .txt", plain, None)):
                d = work / f"{name.replace(' ', '-')}-{i}"
                if files:
                    seconds = timed(lambda d=d, inp=inp, files=files: stock_query(
                        spark, inp, d / "out", d / "ck", len(REGIONS), files=files))
                else:
                    seconds = timed(lambda d=d, inp=inp: regional_query(
                        spark, inp, d / "out", d / "ck", args.rows_per_file))
                landed = delta_rows(d / "out")
                assert landed == rows, f"{name} wrote {landed:,} of {rows:,} rows"
                print(f"run {i} {name}: {rows / seconds:,.0f} rows/s ({seconds:.1f} s)", flush=True)
                if i:
                    rates.setdefault(name, []).append(rows / seconds)
                shutil.rmtree(d, ignore_errors=True)
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {name: statistics.median(v) for name, v in rates.items()}
    lines = [
        "<!-- compressed:begin -->",
        "## Compressed input (issue 46)",
        "",
        f"- command: `python -m benchmarks.compressed --rows-per-file {args.rows_per_file} --files-per-region "
        f"{args.files_per_region} --repeats {args.repeats}` ({(time.perf_counter() - began) / 60:.1f} min)",
        f"- input: {rows:,} lines of about 200 bytes in 16 regions x {args.files_per_region} files: "
        f"{sizes['plain']:,.0f} MB as `.txt`, {sizes['packed']:,.1f} MB as `.txt.gz` (gzip level 6); Spark "
        "`local[2,4]`, AvailableNow into Delta, upper-cased, both pipelines in one session, runs alternating after "
        "a warm-up round",
        "",
        "| input | metric | stock (text source) | regional (files) | ratio (medians) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind in (".gz", ".txt"):
        stock, mine = rates[f"stock {kind}"], rates[f"regional {kind}"]
        lines.append(f"| `{kind}` | rows/s, min/median/max | {spread(stock)} | {spread(mine)} | "
                     f"{med[f'regional {kind}'] / med[f'stock {kind}']:.2f}x |")
    lines += ["", f"- regional reads `.gz` at {med['regional .gz'] / med['regional .txt']:.2f}x its `.txt` rate; "
              f"stock at {med['stock .gz'] / med['stock .txt']:.2f}x",
              "<!-- compressed:end -->"]
    write_section(Path(args.out), "compressed", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
