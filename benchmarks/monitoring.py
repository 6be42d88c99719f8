"""What the Spark UI tab and the metrics cost (issue 28): scenario 1 (throughput at volume) and scenario 4a (epoch
latency at 1,000 known regions, 10 with data), each with monitoring off and on, in driver processes of their own
(the status snapshots are switched by the environment the driver's runners inherit), alternating off, on, off, on.

- off: ``REGIONAL_STATUS=off`` (no status.json), the Spark UI off (no tab, no endpoint);
- on: status snapshots, the Spark UI with the Regional tab, Spark's PrometheusServlet, and a scraper asking for
  ``/metrics/regional``, ``/metrics/prometheus`` and the query's tab page every second while the query runs.

    python -m benchmarks.monitoring [--rows-per-file N] [--files-per-region N] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pyspark

from benchmarks.common import LINE_PAD, delta_rows, regional_query, spread, timed, write_input
from benchmarks.sections import markers, write_section

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = markers("monitoring")


def child(work: Path, monitoring: bool, per_epoch: int, rows: int) -> dict[str, float]:
    """In the driver process of one setting: scenario 1's regional run, then scenario 4a's epoch latency."""
    import regional
    from benchmarks.many_regions import epoch_latency
    from regional.testing.kafka_broker import free_port

    port = free_port()
    # Both settings run Spark's UI and PrometheusServlet, scraped alike: what differs is regional's part.
    conf = {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "4g",
            "spark.ui.enabled": "true", "spark.ui.port": str(port), "spark.port.maxRetries": "0",
            "spark.metrics.conf.*.sink.prometheusServlet.class": "org.apache.spark.metrics.sink.PrometheusServlet",
            "spark.metrics.conf.*.sink.prometheusServlet.path": "/metrics/prometheus",
            "spark.regional.ui.enabled": "true" if monitoring else "false"}
    spark = regional.local_spark("local[2,4]", "regional-bench-monitoring", conf)
    regional.register(spark)
    spark.sparkContext.setLogLevel("OFF")
    stop, scrapes = threading.Event(), [0]

    def scrape() -> None:  # what a Prometheus server and an engineer with the tab open would ask for
        base = f"http://127.0.0.1:{port}"
        while not stop.wait(1.0):
            for path in ("/metrics/regional", "/metrics/prometheus", "/regional/") if monitoring else (
                    "/metrics/prometheus", "/jobs/"):
                try:
                    with urllib.request.urlopen(base + path, timeout=5) as response:
                        response.read()
                    scrapes[0] += 1
                except OSError:
                    pass

    threading.Thread(target=scrape, daemon=True).start()
    warm = work / "warm-up"  # one small query first: the JVM and the Python workers warm
    write_input(warm / "in", 1000, 1, LINE_PAD)
    regional_query(spark, warm / "in", warm / "out", warm / "ck", 1000).awaitTermination()
    seconds = timed(lambda: regional_query(spark, work / "in", work / "out", work / "ck", per_epoch))
    assert delta_rows(work / "out") == rows, "the regional query lost or doubled rows"
    latency, _ = epoch_latency(spark, work, 1000)
    stop.set()
    spark.stop()
    return {"rows_per_s": rows / seconds, "epoch_s": latency, "scrapes": scrapes[0],
            "status_json": float((work / "ck" / "regional" / "status.json").exists())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.monitoring", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows-per-file", type=int, default=62_500)
    parser.add_argument("--files-per-region", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--child", nargs=4, metavar=("WORK", "MONITORING", "PER_EPOCH", "ROWS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        work, monitoring, per_epoch, rows = Path(args.child[0]), args.child[1] == "on", *map(int, args.child[2:])
        print("RESULT " + json.dumps(child(work, monitoring, per_epoch, rows)), flush=True)
        return 0
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="regional-bench-monitoring-"))
    results: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    try:
        rows = write_input(root / "input", args.rows_per_file, args.files_per_region, LINE_PAD)
        for i in range(args.repeats):
            for setting in ("off", "on"):
                work = root / f"{setting}-{i}"
                work.mkdir()
                (work / "in").symlink_to(root / "input")
                env = {**os.environ, "REGIONAL_STATUS": setting}
                done = subprocess.run([sys.executable, "-m", "benchmarks.monitoring", "--child", str(work), setting,
                                       str(args.rows_per_file), str(rows)],
                                      cwd=ROOT, env=env, capture_output=True, text=True)
                result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                assert done.returncode == 0 and result, done.stdout[-2000:] + done.stderr[-3000:]
                results[setting].append(json.loads(result[0][len("RESULT "):]))
                print(setting, results[setting][-1], flush=True)
                shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert all(r["status_json"] for r in results["on"]) and not any(r["status_json"] for r in results["off"])
    rate = {k: [r["rows_per_s"] for r in v] for k, v in results.items()}
    epoch = {k: [r["epoch_s"] for r in v] for k, v in results.items()}
    ratio_1 = statistics.median(rate["on"]) / statistics.median(rate["off"])
    ratio_4a = statistics.median(epoch["on"]) / statistics.median(epoch["off"])
    section = "\n".join([
        BEGIN,
        "## What the Spark UI tab and the metrics cost (issue 28)",
        "",
        f"- command: `python -m benchmarks.monitoring --rows-per-file {args.rows_per_file} --files-per-region "
        f"{args.files_per_region} --repeats {args.repeats}` ({(time.perf_counter() - began) / 60:.1f} min)",
        f"- machine: 2 cores, Linux {platform.machine()}, Python {platform.python_version()}, pyspark "
        f"{pyspark.__version__}; each setting in a driver process of its own, alternating off, on, off, on",
        "- both: Spark's UI and PrometheusServlet on, a warm-up query first. off: no status snapshots "
        "(`REGIONAL_STATUS=off`), no Regional tab or endpoint (`spark.regional.ui.enabled=false`), a scraper asking "
        "for /metrics/prometheus and /jobs/ every second; on: snapshots after epochs (at most one per 2 s and a "
        "twentieth of a core), the tab, and a scraper asking for /metrics/regional, /metrics/prometheus and the "
        f"tab every second ({statistics.median(r['scrapes'] for r in results['on']):.0f} pages per run, median)",
        "",
        "| scenario | metric | off | on | on / off |",
        "| --- | --- | --- | --- | --- |",
        f"| 1. fault-free throughput, 16 regions, {rows:,} lines -> Delta | rows/s (min/median/max) | "
        f"{spread(rate['off'])} | {spread(rate['on'])} | {ratio_1:.2f}x |",
        f"| 4a. 1,000 known regions, 10 with data per epoch | epoch latency p50 (s), per run | "
        f"{', '.join(f'{v:.2f}' for v in epoch['off'])} | {', '.join(f'{v:.2f}' for v in epoch['on'])} | "
        f"{ratio_4a:.2f}x |",
        END,
    ])
    write_section(Path(args.out), "monitoring", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
