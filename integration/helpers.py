"""Input files, queries and record-by-record checks shared by the integration tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from regional.spark.session import delta_fits_spark
from regional.testing.exactly_once import check, delta_landed
from regional.testing.killable import run_killable as _run_killable

ROOT = Path(__file__).resolve().parent.parent


# pyspark's daemon, over Unix domain sockets, prints this for a worker Spark closes (an idle one at spark.stop(),
# a task cancelled mid-write): its last flush fails at once where TCP buffered it. README names the wart.
_DAEMON_BROKEN_PIPE = re.compile(
    r"Traceback \(most recent call last\):\n"
    r"(?:  File \"[^\"\n]*pyspark/daemon\.py\", line \d+, in \w+\n(?:    [^\n]*\n)*)+"
    r"BrokenPipeError: \[Errno 32\] Broken pipe\n?"
    # or cut short when Spark killed the worker mid-print: a header (and daemon frames) with no exception line
    r"|Traceback \(most recent call last\):\n"
    r"(?:  File \"[^\"\n]*pyspark/daemon\.py\", line \d+, in \w+\n(?:    [^\n]*\n)*)*"
    r"(?=[^ \n]|\Z)(?!\w+(?:Error|Exception|Exit|Interrupt)\b)")


def without_daemon_broken_pipes(output: str) -> str:
    """``output`` without pyspark's daemon BrokenPipeError tracebacks (only those: every frame in daemon.py)."""
    return _DAEMON_BROKEN_PIPE.sub("", output)


def add_file(root: Path, region: str, name: str, values: list[str]) -> None:
    """Append one file to a region's log the way writers must: hidden name, then rename."""
    _publish_files([_stage_file(root, region, name, values)])


def add_epoch_of_files(root: Path, regions: list[str], tag: str, rows: int, pad: int = 0) -> dict[str, list[str]]:
    """One file per region; all are written under hidden names first, then renamed one after the other,
    so a running query rarely sees only some of them (the renames are microseconds apart, not zero:
    a test that needs one epoch to see all of them adds them while its query is stopped)."""
    added = {r: [f"{r}-{tag}-{i}-" + "x" * pad if pad else f"{r}-{tag}-{i}" for i in range(rows)] for r in regions}
    _publish_files([_stage_file(root, r, f"{tag}.txt", values) for r, values in added.items()])
    return added


def _stage_file(root: Path, region: str, name: str, values: list[str]) -> tuple[Path, Path]:
    directory = root / region
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_text("".join(v + "\n" for v in values))
    return tmp, directory / name


def _publish_files(staged: list[tuple[Path, Path]]) -> None:
    for tmp, final in staged:
        os.replace(tmp, final)


def regional_stream(spark: SparkSession, inp: Path | str, ck: Path | str, **options: str) -> DataFrame:
    reader = (spark.readStream.format("regional").option("source", "files").option("path", str(inp))
              .option("checkpointLocation", str(ck)))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def poison_udf(poison: set[str]):
    """An upper-casing UDF that raises on every value in ``poison``: a real poison record, failing in the task."""

    @F.udf("string")
    def parse(value: str) -> str:
        if value in poison:
            raise ValueError(f"poison record {value}")
        return value.upper()

    return parse


def start_to_delta(df: DataFrame, out: Path, ck: Path | str, target: str = "delta", **options: str) -> StreamingQuery:
    writer = (df.select("region", "offset", F.upper("value").alias("value")).writeStream.format("regional")
              .option("target", target).option("path", str(out)).option("checkpointLocation", str(ck))
              .option("keepRegionColumns", "true"))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def wait_for_epochs(query: StreamingQuery, ck: Path, epochs: int, timeout: float = 180) -> None:
    """Wait until the store has recorded ``epochs`` epochs (the query keeps running)."""

    def running() -> None:
        if query.exception() is not None or not query.isActive:
            raise AssertionError(f"query ended early: {query.exception()}")

    _await_epochs(ck, epochs, timeout, running)


def _await_epochs(ck: Path | str, epochs: int, timeout: float, running: Callable[[], None]) -> int:
    """Poll the store (local or on S3) until it holds ``epochs`` records; ``running`` raises if the query has
    ended."""
    import time

    from regional.store import Store

    store = Store(str(ck))
    deadline = time.monotonic() + timeout
    while (recorded := len(store.epochs())) < epochs:
        running()
        assert time.monotonic() < deadline, f"only {recorded} epochs in {timeout}s"
        time.sleep(0.1)
    return recorded


def run_epochs(query: StreamingQuery, ck: Path, epochs: int, timeout: float = 180) -> None:
    """Let the query run until the store has recorded ``epochs`` epochs, then stop it.

    For queries whose failing region keeps them from ever running out of work."""
    try:
        wait_for_epochs(query, ck, epochs, timeout)
    finally:
        query.stop()


def expected_rows(inputs: dict[str, list[str]]) -> dict[str, list[str]]:
    return {r: [v.upper() for v in values] for r, values in inputs.items()}


def merge(*parts: dict[str, list[str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for part in parts:
        for r, values in part.items():
            out[r].extend(values)
    return dict(out)


def table_rows(table: Path, version: int | None = None) -> list[tuple[str, int, str]]:
    dt = DeltaTable(str(table), version=version)
    t = dt.to_pyarrow_table(columns=["region", "offset", "value"])
    columns = (t.column(c).to_pylist() for c in ("region", "offset", "value"))
    return list(zip(*columns, strict=True))


def assert_exactly_once_in_order(table: Path, expected: dict[str, list[str]], spark: SparkSession | None = None):
    """For sources whose offsets count records from 0 (files, generator)."""
    assert_exactly_once(table, {r: list(enumerate(values)) for r, values in expected.items()}, spark)


def assert_exactly_once(table: Path, expected: dict[str, list[tuple[int, str]]], spark: SparkSession | None = None):
    """Every expected record ``(offset, value)`` is in the table exactly once, with its offset and value, and
    each region's records were published in input order (``regional.testing.exactly_once``: nothing past a
    gap). Offsets need not be contiguous (Kafka's are not). With ``spark``, delta-spark reads the same rows."""
    check(expected, delta_landed(table)).assert_ok()
    if spark is not None and delta_fits_spark():  # else the session has no Delta (regional_conf)
        spark_rows = spark.read.format("delta").load(str(table)).select("region", "offset", "value").collect()
        assert sorted(tuple(r) for r in spark_rows) == sorted(table_rows(table))


def run_killable(args: list[str], failpoint: str | None, marker: Path, timeout: float = 240,
                 kill_after: float | None = None) -> str:
    """``regional.testing.killable.run_killable`` for children of this repository (``integration.*``)."""
    return _run_killable(args, failpoint, marker, timeout, kill_after, cwd=ROOT)


@contextmanager
def child_driver(args: list[str]) -> Iterator[subprocess.Popen[str]]:
    """``python -m <args>`` (a driver of its own) running beside the test; leaving the block waits for it to
    finish, and it must succeed."""
    child = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        yield child
        output, _ = child.communicate(timeout=600)
        assert child.returncode == 0, output[-4000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def wait_for_child_epochs(child: subprocess.Popen[str], ck: Path | str, epochs: int, timeout: float = 300) -> int:
    """Wait until the child's store has recorded ``epochs`` epochs (the child must still run); how many it has."""

    def running() -> None:
        assert child.poll() is None, f"the child ended early:\n{child.stdout.read()[-3000:] if child.stdout else ''}"

    return _await_epochs(ck, epochs, timeout, running)


def failure_summary(output: str, limit: int = 3000) -> str:
    """What a failed child printed that says why: its error and exception lines (a StreamingQueryException's
    message ends with the query's plan, which is all a plain tail of the output would keep), then its tail."""
    reasons = [line for line in output.splitlines()
               if any(w in line for w in ("Error", "Exception", "error:", "Caused by"))]
    return ("\n".join(reasons)[:limit] + "\n--- tail ---\n" + output[-1000:]).strip()


def run_until_error(query: StreamingQuery) -> str:
    """The error the running query fails with (it must fail)."""
    import pytest

    try:
        with pytest.raises(Exception) as err:
            query.processAllAvailable()
    finally:
        query.stop()
    return str(err.value)


def error_of(start) -> str:
    """The error a query fails with, whether ``start()`` raises it or the running query does."""
    try:
        query = start()
    except Exception as exc:
        return str(exc)
    return run_until_error(query)


def task_files_left(spark: SparkSession, query_id: str) -> list[str]:
    """The task files a query's tasks left where its Python workers keep them (their SPARK_LOCAL_DIRS, a block
    manager directory in local mode, not the driver's temporary directory)."""
    import os
    import tempfile

    from regional.ids import encode_region

    def local_dirs(_: object) -> str:
        return os.environ.get("SPARK_LOCAL_DIRS", "") or tempfile.gettempdir()

    roots = {d for ds in spark.sparkContext.parallelize([0], 1).map(local_dirs).collect() for d in ds.split(",") if d}
    assert roots, "no SPARK_LOCAL_DIRS seen from a Python worker"
    left = []
    for root in roots:
        directory = Path(root) / "regional-tasks" / encode_region(query_id)
        left += [str(p.relative_to(directory)) for p in directory.rglob("*")] if directory.exists() else []
    return left

