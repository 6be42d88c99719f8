"""Regional queries on a real Spark standalone cluster on 127.0.0.1 (a master and two workers from pyspark's
``bin/spark-class``): an executor SIGKILLed mid-epoch, and a worker lost for good. Spark re-runs the lost
tasks elsewhere; every record lands exactly once, in order, and the regions keep publishing."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

import regional
from integration.helpers import (
    add_epoch_of_files,
    assert_exactly_once_in_order,
    child_driver,
    expected_rows,
    wait_for_child_epochs,
)
from regional.testing.spark_cluster import StandaloneCluster

REGIONS = [f"r{i}" for i in range(4)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = StandaloneCluster(tmp_path_factory.mktemp("cluster"), workers=2).start()
    yield c
    c.stop()


def run_with_faults(cluster: StandaloneCluster, tmp_path: Path, records: int,
                    faults: list[tuple[int, Callable[[], None]]]) -> list[int]:
    """The child driver runs the query to its end while each fault strikes once the store holds that many
    epochs; returns the epoch count at each fault."""
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    inputs = add_epoch_of_files(inp, REGIONS, "001", records)
    struck = []
    with child_driver(["integration.cluster_child", cluster.url, str(inp), str(out), str(ck), "20"]) as child:
        for at, fault in faults:
            struck.append(wait_for_child_epochs(child, ck, at))
            fault()
    assert_exactly_once_in_order(out, expected_rows(inputs))
    store = regional.status(ck)
    assert all(store.regions[r].committed_offset == records for r in REGIONS)
    assert len(store.epochs) > struck[-1], "no epoch was recorded after the last fault"
    return struck


def kill_an_executor(cluster: StandaloneCluster) -> Callable[[], None]:
    def fault() -> None:
        before = cluster.executor_pids()
        assert before, "no executor is running"
        cluster.kill_executor(before[0])
        deadline = time.monotonic() + 60  # the worker starts a new executor for the app
        while before[0] in cluster.executor_pids() or len(cluster.executor_pids()) < len(before):
            assert time.monotonic() < deadline, "the killed executor was not replaced"
            time.sleep(0.2)
    return fault


def test_an_executor_killed_mid_epoch_loses_and_doubles_nothing(cluster, tmp_path):
    run_with_faults(cluster, tmp_path, 20, [(2, kill_an_executor(cluster))])


@pytest.mark.campaign
def test_executors_killed_again_and_again_then_a_worker_lost_for_good(cluster, tmp_path):
    faults = [(2, kill_an_executor(cluster)), (5, kill_an_executor(cluster)), (8, kill_an_executor(cluster)),
              (11, lambda: cluster.kill_worker(1))]
    try:
        run_with_faults(cluster, tmp_path, 100, faults)
    finally:
        if len(cluster.alive_workers()) < cluster.count:  # later tests get both workers again
            cluster.add_worker(len(cluster.workers))


@pytest.mark.parametrize("lines, kill_after_epochs", [
    pytest.param(60, (2,), marks=pytest.mark.campaign),  # 97 s idle: CI keeps the executor killed mid-epoch
    pytest.param(400, (2, 10, 20, 30), marks=pytest.mark.campaign),  # the long one: four executors killed
])
def test_a_query_on_executors_that_cannot_see_the_drivers_disk(s3, tmp_path, tmp_path_factory, lines,
                                                              kill_after_epochs):
    """The workers run in mount namespaces of their own with an empty tmpfs over every directory this test and
    the driver write to: executors see only S3 and their own directories. Input files on S3 into a Delta table on
    S3, the checkpoint on S3, executors SIGKILLed mid-run: every record once, in order."""
    import uuid

    from regional.location import parse_location
    from regional.storage import open_storage
    from regional.testing.exactly_once import check, delta_landed

    sentinel = tmp_path / "driver-only"
    sentinel.write_text("the driver's")
    cluster = StandaloneCluster(tmp_path / "cluster", workers=2,
                                private_dirs=[tmp_path_factory.getbasetemp()]).start()
    bucket = s3.create_bucket(f"cluster-{uuid.uuid4().hex[:12]}")
    ck, out, inp = f"{bucket}/ck", f"{bucket}/out", f"{bucket}/in"
    inputs = {f"r{i}": [f"r{i}-{n}" for n in range(lines)] for i in range(4)}
    half = lines // 2
    for region, values in inputs.items():  # two files per region
        for part in (0, 1):
            open_storage(parse_location("in", inp)).write(
                f"{region}/{part:03d}.txt", "".join(v + "\n" for v in values[part * half:(part + 1) * half]).encode())
    try:
        # The child fails unless an executor is shown not to see ``sentinel``, a file this test wrote.
        with child_driver(["integration.no_shared_disk_child", cluster.url, inp, ck, out, s3.endpoint,
                           str(sentinel)]) as child:
            for epochs in kill_after_epochs:
                wait_for_child_epochs(child, ck, epochs)
                executors = cluster.executor_pids()
                assert executors, "no executor is running"
                cluster.kill_executor(executors[0])
    finally:
        cluster.stop()
    check({r: [(o, v.upper()) for o, v in enumerate(values)] for r, values in inputs.items()},
          delta_landed(out)).assert_ok()
