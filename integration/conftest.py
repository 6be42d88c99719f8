"""One local SparkSession (with Delta and task retries) for the whole integration run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from regional.testing.costs import start_up
from regional.testing.spark_conf import use_quick_spark_defaults

ROOT = Path(__file__).resolve().parent.parent

# Python workers must run this interpreter and import integration.faults.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# integration/site: pyspark imported from its bytecode, not compiled from Spark's zip in every worker (its docstring)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), str(ROOT / "integration" / "site"), os.environ.get("PYTHONPATH", "")) if p)

# Every SparkSession of the run (this process's, child drivers', Connect servers') reads it: faster JVMs for a
# few records each, the same results (regional/testing/spark_conf.py).
use_quick_spark_defaults(Path(os.environ.get("TMPDIR", "/tmp")) / f"regional-spark-conf-{os.getpid()}")

MASTER = "local[4,4]"  # four cores, four attempts per task
CAMPAIGN = os.environ.get("REGIONAL_CAMPAIGN") == "1"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``campaign`` (more kill points of the same crash tests, random kills, long outages, replays
    after kills: the slow ones, each marked with its time) run only with REGIONAL_CAMPAIGN=1: the README's test
    command stays within CI's time, the campaign command runs all."""
    if CAMPAIGN:
        return
    skip = pytest.mark.skip(reason="a campaign test: run with REGIONAL_CAMPAIGN=1")
    for item in items:
        if item.get_closest_marker("campaign"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def spark():
    import regional

    # Poison records get no retries here: the shipped 4, a minute apart, would take minutes per record (issue 45);
    # tests of retries and of the defaults give them as options.
    with start_up("the shared SparkSession"):
        session = regional.local_spark(MASTER, "regional-integration", {"spark.regional.deadLetterRetries": "0"})
    regional.register(session)
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()


@pytest.fixture(autouse=True)
def _shared_session_conf_restored(request):
    """Every test shares one session: the ``spark.regional.*`` defaults a test (or a docs example it runs) sets
    are put back after it, and regional registered again (docs/options.md's example sets
    ``spark.regional.maxConsecutiveFailures=5`` and registers, which would hold for every later test in the run).
    Only those: Spark's and Delta's own keys are not the tests' to undo (delta-spark sets
    ``spark.sql.parquet.fieldId.read.enabled`` in the session itself, seen at a CREATE of an id-mapped table,
    and the id-mode test of test_delta_protocol.py failed when this fixture unset it)."""
    if "spark" not in request.fixturenames:
        yield
        return
    import regional

    session = request.getfixturevalue("spark")
    before = dict(session.conf.getAll)
    yield
    after = dict(session.conf.getAll)
    changed = sorted(k for k in before.keys() | after.keys()
                     if before.get(k) != after.get(k) and k.startswith("spark.regional."))
    for key in changed:
        if key in before:
            session.conf.set(key, before[key])
        else:
            session.conf.unset(key)
    if changed:
        regional.register(session)


@pytest.fixture
def dirs(tmp_path):
    return tmp_path / "in", tmp_path / "out", tmp_path / "ck"


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """One real Kafka broker (KRaft, loopback) for the run, started on first use; its jars are fetched
    with Maven into ~/.cache/regional the first time."""
    from regional.testing.kafka_broker import KafkaBroker

    with start_up("the Kafka broker"):
        broker = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def postgres():
    """One real PostgreSQL server (Debian's package, installed with apt if missing) on a loopback port, with
    max_prepared_transactions set; stopped and removed at the end."""
    from regional.testing.postgres_server import PostgresServer

    with start_up("the PostgreSQL server"):
        server = PostgresServer().start()
    yield server
    server.remove()


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """One real S3 API server (s3proxy 4.1.0 on a loopback port; its jar and hadoop-aws's come from Maven
    Central on first use), with this process's regional storage settings pointing at it."""
    import json

    from regional.storage.config import STORAGE_CONF_ENV
    from regional.testing.s3_server import S3Server

    with start_up("the S3 API server"):
        server = S3Server(tmp_path_factory.mktemp("s3")).start()
    previous = os.environ.get(STORAGE_CONF_ENV)
    os.environ[STORAGE_CONF_ENV] = json.dumps(server.hadoop_conf())
    yield server
    if previous is None:
        os.environ.pop(STORAGE_CONF_ENV, None)
    else:
        os.environ[STORAGE_CONF_ENV] = previous
    server.stop()
