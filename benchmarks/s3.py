"""Scenario S3: the volume scenario into a Delta table on S3 (s3proxy 4.1.0 on a loopback port), regional next to
stock delta-spark writing the same rows to the same server over s3a://, in the same run.

    python -m benchmarks.s3 [--rows-per-file 20000] [--files-per-region 4] [--repeats 3] [--input s3|local]
                            [--out BENCHMARKS.md]

16 regions of text files (on S3, or local with ``--input local``) -> upper-case -> Delta on S3; both checkpoints on
S3 too. Every request goes
through a counting proxy, so the bytes each pipeline sends to S3 (its PUTs, and the request heads) are measured:
copies or moves of data files would show there. One SparkSession (``local[2,4]``) with the s3a jars; the first
pair of runs warms up and is not counted. Writes the S3 section of BENCHMARKS.md and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import uuid
from pathlib import Path

import regional
from benchmarks.common import LINE_PAD, REGIONS, spread, timed, write_input
from benchmarks.sections import markers, write_section
from regional.storage.config import STORAGE_CONF_ENV
from regional.testing.faulty_proxy import FaultyProxy
from regional.testing.s3_server import S3Server, hadoop_conf, spark_conf, upload_input

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = markers("s3")


def table_rows(table: str) -> int:
    from deltalake import DeltaTable

    from regional.location import parse_location
    from regional.storage.config import object_store_options

    options = object_store_options(parse_location("table", table))
    return DeltaTable(table, storage_options=options).to_pyarrow_dataset().count_rows()


def start_query(spark, pipeline: str, inp: str, out: str, ck: str, rows_per_file: int):
    """Stock Spark's text source into delta-spark, or regional's files source into its Delta target."""
    from pyspark.sql import functions as F

    if pipeline == "stock":
        df = (spark.readStream.format("text").option("maxFilesPerTrigger", str(len(REGIONS)))
              .load(f"{inp}/*/*.txt").withColumn("region", F.substring_index("value", " ", 1)))
        return (df.select("region", F.upper("value").alias("value")).writeStream.format("delta")
                .option("checkpointLocation", ck).trigger(availableNow=True).start(out))
    df = (spark.readStream.format("regional").option("source", "files").option("path", inp)
          .option("maxRecordsPerRegion", str(rows_per_file)).load())
    return (df.select("region", "offset", F.upper("value").alias("value")).writeStream.format("regional")
            .option("target", "delta").option("path", out).option("checkpointLocation", ck)
            .trigger(availableNow=True).start())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows-per-file", type=int, default=20_000)
    parser.add_argument("--files-per-region", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--input", choices=("s3", "local"), default="s3", help="where the input files are")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="regional-bench-s3-"))
    server = S3Server(work / "s3").start()
    proxy = FaultyProxy(("127.0.0.1", server.port))
    os.environ[STORAGE_CONF_ENV] = json.dumps(hadoop_conf(proxy.endpoint))
    spark = regional.local_spark("local[2,4]", "regional-benchmarks-s3", {
        **spark_conf(proxy.endpoint), "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "4g"})
    regional.register(spark)
    spark.sparkContext.setLogLevel("OFF")
    local_in = work / "in"
    rows = write_input(local_in, args.rows_per_file, args.files_per_region, LINE_PAD)
    size_mb = sum(f.stat().st_size for f in local_in.rglob("*.txt")) / 2**20
    inp = str(local_in)
    if args.input == "s3":  # uploaded once, before anything is measured
        inp = f"{server.create_bucket('bench-input')}/in"
        upload_input(local_in, inp)

    def start(pipeline: str, out: str, ck: str):
        return start_query(spark, pipeline, inp, out, ck, args.rows_per_file)
    times: dict[str, list[float]] = {"regional": [], "stock": []}
    sent: dict[str, list[int]] = {"regional": [], "stock": []}
    try:
        for i in range(args.repeats + 1):
            bucket = server.create_bucket(f"bench-{i}-{uuid.uuid4().hex[:8]}")
            for pipeline in ("stock", "regional"):
                out, ck = f"{bucket}/{pipeline}", f"{bucket}/{pipeline}-ck"
                before = proxy.sent_bytes
                seconds = timed(lambda p=pipeline, o=out, c=ck: start(p, o, c))
                landed = table_rows(out)
                assert landed == rows, f"{pipeline} landed {landed} rows of {rows}"
                if i:
                    times[pipeline].append(seconds)
                    sent[pipeline].append(proxy.sent_bytes - before)
    finally:
        spark.stop()
        proxy.stop()
        server.stop()
    rate = {k: [rows / t for t in v] for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in rate.items()}
    ratio = med["regional"] / med["stock"]
    mb = {k: statistics.median(v) / 2**20 for k, v in sent.items()}
    section = "\n".join([
        BEGIN,
        "## S3: the volume scenario into Delta on S3 (s3proxy)",
        "",
        f"Command: `python -m benchmarks.s3 --rows-per-file {args.rows_per_file} --files-per-region "
        f"{args.files_per_region} --repeats {args.repeats} --input {args.input}`. 16 regions, {rows:,} lines "
        f"({size_mb:,.0f} MB) of text files {'on S3' if args.input == 's3' else 'on local disk'}, upper-cased, "
        "into a Delta table on s3proxy 4.1.0 (loopback), both checkpoints on S3; "
        "stock is Spark's text source into delta-spark over s3a://, regional is source=files into target=delta "
        "(parquet written by the tasks through obstore, committed by delta-rs). Same session, same server, in "
        "the same run; the first pair of runs warms up and is not counted.",
        "",
        "| metric | stock | regional | regional/stock | goal | met |",
        "|---|---|---|---|---|---|",
        f"| rows/s (min/median/max) | {spread(rate['stock'])} | {spread(rate['regional'])} | {ratio:.2f}x | "
        f">= 1.0x stock | {'yes' if ratio >= 1.0 else 'no'} |",
        f"| MB sent to S3 per run (median) | {mb['stock']:,.1f} | {mb['regional']:,.1f} | "
        f"{mb['regional'] / mb['stock']:.2f}x | no copies | "
        f"{'yes' if mb['regional'] <= mb['stock'] * 1.1 else 'no'} |",
        "",
        "Bytes sent are everything the clients sent through a counting proxy: request heads and bodies (the "
        "data files, the Delta log, the checkpoints, regional's store).",
        END,
    ])
    write_section(args.out, "s3", section)
    print(f"(work directory {work})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
