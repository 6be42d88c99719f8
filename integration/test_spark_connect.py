"""regional over Spark Connect: a real Connect server (pyspark's SparkConnectServer with regional's shim and
Delta, ``regional.testing.connect_server``) in its own process, local[2,3] (task retries), and clients in
other processes (``integration.connect_child``) that start no JVM: files a, b, c into Delta, region b's
target down in the first epochs, a UDF that raises on one record of a (dead-lettered), checked record by
record; then the server SIGKILLed mid-run and restarted, and the query restarted from a client."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

import regional
from integration.helpers import ROOT, add_epoch_of_files, assert_exactly_once
from regional.shim_jar import SHIM_JAR
from regional.spark.shim import EXTENSION
from regional.testing.connect_server import ConnectServer

ROWS = 7  # per region; the client reads at most 3 per region and epoch


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ConnectServer(tmp_path_factory.mktemp("connect"), pythonpath=[str(ROOT)]) as running:
        yield running


def client(server: ConnectServer | None, work: Path, *args: str, timeout: float = 400,
           python: str = sys.executable) -> dict:
    """Runs the Connect client in a process of its own and returns what it printed as ``CHILD-RESULT``; with no
    ``server``, the client starts one in its own process (``remote("local[2,3]")``)."""
    url, env = (server.url, client_env()) if server else ("local[2,3]", {**os.environ, "PYTHONPATH": str(ROOT)})
    if python != sys.executable:  # a venv without regional installed: regional from this checkout
        env["PYTHONPATH"] = f"{ROOT / 'python'}{os.pathsep}{ROOT}"
    result = subprocess.run([python, "-m", "integration.connect_child", url, str(work), *args],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    found = [line for line in result.stdout.splitlines() if line.startswith("CHILD-RESULT ")]
    server_log = server.log_path.read_text(errors="replace")[-3000:] if server else ""
    assert result.returncode == 0 and found, (result.returncode, result.stdout[-3000:], result.stderr[-6000:],
                                             server_log)
    return json.loads(found[0].removeprefix("CHILD-RESULT "))


@pytest.fixture(scope="module")
def client_only_python(tmp_path_factory) -> str:
    """A venv with pyspark-client (Spark Connect's client alone: no JVM jars, no py4j) and regional's other
    requirements from setup.cfg. pyspark-client 4.2.1 is not on PyPI; 4.2.0 speaks the same Connect protocol."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    requirements = [r for r in config["options"]["install_requires"].split() if not r.startswith("pyspark")]
    venv = tmp_path_factory.mktemp("client-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "pyspark-client==4.2.0", *requirements], check=True,
                   timeout=900)
    return python


def client_env() -> dict[str, str]:
    """No Java for the client: were pyspark to reach for a JVM (py4j), it could not start one."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_SUBMIT_ARGS")}
    return {**env, "JAVA_HOME": "/nonexistent/java", "PYTHONPATH": str(ROOT)}


def expected(inputs: dict[str, list[str]], poison: set[tuple[str, int]]) -> dict[str, list[tuple[int, str]]]:
    return {r: [(o, v.upper()) for o, v in enumerate(values) if (r, o) not in poison] for r, values in inputs.items()}


def dead_letters(work: Path) -> list[tuple[str, int, str, str]]:
    rows = DeltaTable(str(work / "dead-letters")).to_pyarrow_table().to_pylist()
    return sorted((r["region"], r["offset"], r["value"], r["error"]) for r in rows)


def test_a_failing_region_and_a_poison_record_over_connect_exactly_once(server, tmp_path):
    inputs = add_epoch_of_files(tmp_path / "in", ["a", "b", "c"], "001", ROWS)
    poison = inputs["a"][4]

    # A first client runs 3 epochs (b's target down in epochs 0 and 1) and stops with regional.stop.
    first = client(server, tmp_path, "3", "0,1", poison)
    assert first["jvms"] == [] and first["py4j"] is False, first
    assert first["exception"] is None, first
    # regional.stop ends the run whole, or at once when the only region behind is a's poison record waiting for
    # its evidence (an epoch after its lone failure, docs/design.md): the next start dead-letters it.
    assert first["stopped_whole"] or {r for r, s in first["states"].items() if s != "ok"} == {"a"}, first
    status = regional.status(tmp_path / "ck")
    assert all("b" in e.fallen_back for e in status.epochs[:2]), status.epochs
    assert status.epochs[0].fallen_back["b"].ref_epoch == -1
    assert "shard of region b is down" in status.epochs[0].fallen_back["b"].reason
    # The settings given on writeStream reached the server's source through the shim's listener.
    taken = (tmp_path / "ck" / "regional" / "write-options.taken.json").read_text()  # taken by the first plan
    written = json.loads(taken.splitlines()[1])
    assert written["recorded_by"] == "jvm-shim" and written["options"] == {"maxDeadLettersPerEpoch": "5"}

    # A second client finishes the input with Trigger.AvailableNow: everything landed once, in order.
    second = client(server, tmp_path, "0", "", poison, "--bounded")
    assert second["exception"] is None and second["jvms"] == [], second
    assert set(second["states"].values()) == {"ok"}, second
    assert_exactly_once(tmp_path / "out", expected(inputs, {("a", 4)}))
    assert dead_letters(tmp_path) == [("a", 4, poison, f"ValueError: poison record {poison}")]


@pytest.mark.campaign  # 63 s idle (a venv of its own), keeping CI within its time
def test_a_client_with_only_pyspark_client_installed_runs_regional_exactly_once(server, client_only_python,
                                                                              tmp_path):
    inputs = add_epoch_of_files(tmp_path / "in", ["a", "b", "c"], "001", ROWS)
    poison = inputs["b"][5]
    result = client(server, tmp_path, "0", "0", poison, "--bounded", python=client_only_python)
    assert result["exception"] is None and result["jvms"] == [] and result["py4j"] is False, result
    assert set(result["states"].values()) == {"ok"}, result
    assert "b" in regional.status(tmp_path / "ck").epochs[0].fallen_back
    assert_exactly_once(tmp_path / "out", expected(inputs, {("b", 5)}))
    assert dead_letters(tmp_path) == [("b", 5, poison, f"ValueError: poison record {poison}")]


def test_a_client_script_that_ends_without_spark_stop_exits(server, tmp_path):
    """regional.register adds a streaming listener, and pyspark's Connect client then runs a listener bus thread
    that is not a daemon: before regional removed its listener at the main thread's end, such a script never
    exited (Python joined that thread for ever). The timeout is generous; the test is that the process ends."""
    inputs = add_epoch_of_files(tmp_path / "in", ["a", "b"], "001", 3)
    child = subprocess.Popen([sys.executable, "-m", "integration.connect_exit_child", server.url, str(tmp_path)],
                             cwd=ROOT, env=client_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = child.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        child.kill()
        stdout, stderr = child.communicate()
        raise AssertionError(f"the client did not exit after its script ended: {stdout[-2000:]} {stderr[-3000:]}") \
            from None
    assert child.returncode == 0 and "CHILD-DONE active=False" in stdout, (child.returncode, stdout, stderr[-3000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    assert_exactly_once(tmp_path / "out", {r: list(enumerate(values)) for r, values in inputs.items()})


@pytest.mark.campaign  # 81 s idle, keeping CI within its time
def test_server_sigkilled_mid_run_then_the_query_restarted_from_a_client_exactly_once(server, tmp_path):
    inputs = add_epoch_of_files(tmp_path / "in", ["a", "b", "c"], "001", 30)
    poison = inputs["c"][17]
    ck = tmp_path / "ck"
    child = subprocess.Popen([sys.executable, "-m", "integration.connect_child", server.url, str(tmp_path), "1000",
                              "1", poison], cwd=ROOT, env=client_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not ((ck / "regional" / "epochs").is_dir() and len(regional.status(ck).epochs) >= 3):
            assert child.poll() is None, child.stdout.read() if child.stdout else ""
            assert time.monotonic() < deadline, "no 3 epochs in 300 s"
            time.sleep(0.1)
        time.sleep(0.7)  # into a later epoch's tasks or commit
        server.kill()
        killed_at = len(regional.status(ck).epochs)
    finally:
        child.kill()  # its gRPC channel would retry the dead server for minutes
        child.wait()
    server.start()

    done = client(server, tmp_path, "0", "", poison, "--bounded")
    assert done["exception"] is None and set(done["states"].values()) == {"ok"}, done
    assert done["epochs"] > killed_at
    assert_exactly_once(tmp_path / "out", expected(inputs, {("c", 17)}))
    assert dead_letters(tmp_path) == [("c", 17, poison, f"ValueError: poison record {poison}")]


REGISTER_SCRIPT = ("import sys, regional\nfrom pyspark.sql import SparkSession\n"
                   "spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()\n"
                   "try:\n    regional.register(spark)\nexcept regional.RegionalConfigError as e:\n"
                   "    print('REFUSED', e)\nspark.stop()\n")


def refusal(tmp_path: Path, without: tuple[str, ...]) -> str:
    with ConnectServer(tmp_path, without=without) as bare:
        result = subprocess.run([sys.executable, "-c", REGISTER_SCRIPT, bare.url], cwd=ROOT, env=client_env(),
                                capture_output=True, text=True, timeout=120)
    assert "REFUSED " in result.stdout, (result.stdout, result.stderr[-3000:])
    return result.stdout.partition("REFUSED ")[2]


def test_a_server_without_the_shim_is_refused_with_what_to_do(tmp_path):
    """The shim records writeStream's settings where the query runs: without it nothing can, over Connect."""
    refused = refusal(tmp_path, (str(SHIM_JAR), EXTENSION))
    assert "lacks io.regional.shim.RegionalExtensions" in refused
    assert "--conf spark.sql.extensions=io.regional.shim.RegionalExtensions" in refused
    assert "Spark Connect" in refused


def test_a_server_that_names_the_extension_but_lacks_the_jar_is_refused(tmp_path):
    """Spark only logs that it cannot load a configured extension and starts without it; a query would then run
    with nothing recording its settings."""
    refused = refusal(tmp_path, (str(SHIM_JAR),))
    assert "the shim did not install itself" in refused and "--jars" in refused


@pytest.mark.campaign  # 59 s idle, keeping CI within its time
def test_the_in_process_connect_server_of_remote_local_runs_regional_exactly_once(tmp_path):
    """``regional.configure(SparkSession.builder.remote("local[2,3]"))``: pyspark starts the Connect server in
    the client's process, with regional's shim and Delta."""
    inputs = add_epoch_of_files(tmp_path / "in", ["a", "b", "c"], "001", ROWS)
    poison = inputs["c"][2]
    result = client(None, tmp_path, "0", "0,1", poison, "--bounded")
    assert result["exception"] is None and result["py4j"] is True, result
    assert set(result["states"].values()) == {"ok"}, result
    assert any("b" in e.fallen_back for e in regional.status(tmp_path / "ck").epochs)
    assert_exactly_once(tmp_path / "out", expected(inputs, {("c", 2)}))
    assert dead_letters(tmp_path) == [("c", 2, poison, f"ValueError: poison record {poison}")]
