"""The test run's own report (docs/testing.md, "Where the time goes"): at the end of every run, where the time
went (by module, by kind of test, the shared servers' start-ups) and a plain warning when the run passed the
30-minute goal. It works the same with pytest-xdist: each worker sends its figures to the controller."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

import pytest

from regional.testing import costs

GOAL_S = 30 * 60  # the test command's goal on 2 cores (README); past it the run warns, it does not fail
_began = time.monotonic()
_by_test: dict[str, float] = defaultdict(float)  # nodeid -> setup + call + teardown seconds
_kind_of: dict[str, str] = {}  # nodeid -> the kind of test, from what it started
_start_ups: dict[str, list[float]] = defaultdict(list)
_processes: dict[str, int] = defaultdict(int)


# The test files that take longest, slowest first (from the report below, docs/testing.md): the test command runs
# whole files on two workers in this order (``--dist loadfile --no-loadscope-reorder``), and a long file that
# started last would keep one worker busy while the other idles. Files not named keep their order, after these.
SLOW_FILES_FIRST: tuple[str, ...] = (
    "integration/test_spark_connect.py", "integration/test_kafka_source.py", "integration/test_docs_examples.py",
    "integration/test_object_storage.py", "integration/test_dead_letters.py", "integration/test_delta_protocol.py",
    "integration/test_verdicts.py", "integration/test_kafka_parity.py", "integration/test_exactly_once_contract.py",
    "integration/test_postgres_target.py", "integration/test_jvm_shim.py", "integration/test_regional_epochs.py",
    "integration/test_bounded_and_stop.py", "integration/test_spark_ui.py",
    "integration/test_delta_stats_like_spark.py", "integration/test_console.py", "integration/test_poison_bounded.py",
    "integration/test_postgres_like_jdbc.py", "integration/test_standalone_cluster.py",
)


def pytest_configure(config: pytest.Config) -> None:
    costs.watch_processes()
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_FromWorkers(), "regional-from-workers")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The unit tests belong to the fast loop (``-m smoke``), and the slowest files run first."""
    smoke = pytest.mark.smoke
    for item in items:
        if item.nodeid.startswith("tests/"):
            item.add_marker(smoke)
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    costs.take_processes()  # what started between tests (a fixture's teardown) is not this test's
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    if call.when == "teardown":
        report = outcome.get_result()
        started = costs.take_processes()
        kind = kind_of_test(item, started)
        report.user_properties.append(("regional_kind", kind))
        report.user_properties.append(("regional_processes", json.dumps(started)))


# A test's kind by the first of these processes it started (``costs.PROCESS_KINDS``), in this order.
KIND_BY_PROCESS = (("standalone cluster daemon", "a standalone cluster"),
                   ("Spark Connect server", "a Connect server"),
                   ("a venv for the wheel", "a venv for the wheel"),
                   ("child driver (kills, restarts, exits)", "child drivers (kills, restarts, exits)"))


def kind_of_test(item: pytest.Item, started: dict[str, int]) -> str:
    """What a test spends its time on, from the processes it started and the fixtures it used."""
    for process, kind in KIND_BY_PROCESS:
        if started.get(process):
            return kind
    if "docs" in item.nodeid:
        return "the docs (site build, examples)"
    if "spark" in getattr(item, "fixturenames", ()):
        return "queries in the shared SparkSession"
    return "no Spark (unit tests, servers alone)"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _by_test[report.nodeid] += report.duration
    for key, value in report.user_properties:
        if key == "regional_kind":
            _kind_of[report.nodeid] = str(value)
        elif key == "regional_processes":
            for kind, n in json.loads(str(value)).items():
                _processes[kind] += n


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its start-ups travel to the controller
        workeroutput["regional_start_ups"] = json.dumps(costs.start_ups())
    else:
        for what, seconds in costs.start_ups().items():
            _start_ups[what].extend(seconds)


class _FromWorkers:
    """xdist's hook, registered only where xdist is loaded (``-p no:xdist`` runs without it)."""

    @staticmethod
    def pytest_testnodedown(node: Any, error: Any) -> None:
        for what, seconds in json.loads(getattr(node, "workeroutput", {}).get("regional_start_ups", "{}")).items():
            _start_ups[what].extend(seconds)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if getattr(config, "workeroutput", None) is not None or not _by_test:
        return
    wall = time.monotonic() - _began
    write = terminalreporter.write_line
    terminalreporter.section("regional: where the time went (docs/testing.md)")
    by_kind: dict[str, list[float]] = defaultdict(list)
    for nodeid, seconds in _by_test.items():
        by_kind[_kind_of.get(nodeid, "no Spark (unit tests, servers alone)")].append(seconds)
    write(f"{'kind of test':<45} {'tests':>6} {'seconds':>9}")
    for kind, seconds in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        write(f"{kind:<45} {len(seconds):>6} {sum(seconds):>9.0f}")
    by_module: dict[str, list[float]] = defaultdict(list)
    for nodeid, seconds in _by_test.items():
        by_module[nodeid.split("::")[0]].append(seconds)
    write("")
    write(f"{'module (the 15 slowest)':<45} {'tests':>6} {'seconds':>9}")
    for module, seconds in sorted(by_module.items(), key=lambda kv: -sum(kv[1]))[:15]:
        write(f"{module:<45} {len(seconds):>6} {sum(seconds):>9.0f}")
    write("")
    write(f"{'started (shared per worker) / processes':<45} {'times':>6} {'seconds':>9}")
    for what, seconds in sorted(_start_ups.items()):
        write(f"{what:<45} {len(seconds):>6} {sum(seconds):>9.0f}")
    for kind, n in sorted(_processes.items(), key=lambda kv: -kv[1]):
        write(f"{'process: ' + kind:<45} {n:>6} {'':>9}")
    total = sum(_by_test.values())
    write("")
    write(f"regional: {len(_by_test)} tests, {total / 60:.1f} min of test time, {wall / 60:.1f} min of wall time")
    if wall > GOAL_S:
        terminalreporter.write_line(
            f"regional: WARNING: this run took {wall / 60:.1f} min, past the test command's 30-minute goal on 2 "
            "cores. A loaded machine can do that; if it is the tests, docs/testing.md says where the time goes "
            "and how to keep it down.", yellow=True, bold=True)
