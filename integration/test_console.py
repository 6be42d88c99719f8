"""What a person sees in the terminal (issue 58): a query that fails with regional's error prints regional's
sentence once and no traceback; Ctrl-C prints one line from regional, no py4j or Spark traceback, and starting the
query again loses and doubles nothing. Each in a driver of its own (a terminal's process group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from integration.helpers import ROOT, assert_exactly_once, regional_stream

NOISE = ("WARNING: Using incubator modules",)  # the JVM's own line at start, in every Spark 4.2 session


def run_child(mode: str, work, interrupt: signal.Signals | None = None, group: bool = True) -> tuple[int, list[str]]:
    # the stop's bound, longer than the shipped 10 s: two cores shared with the other pytest worker can make the
    # epoch in flight and the final one take longer, and this test checks what the stop does, not how fast
    env = {**os.environ, "REGIONAL_STOP_ON_SIGNAL_S": "90"}
    child = subprocess.Popen([sys.executable, "-m", "integration.console_child", mode, str(work)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env=env)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # CHILD-RUNNING, once its first epoch is recorded
        assert "CHILD-RUNNING" in line, (line, child.stderr.read() if child.stderr else "")
        if interrupt is not None:
            (work / "in-flight").write_text(str(wait_for_an_epoch_in_flight(work / "ck")))
            # a terminal's Ctrl-C reaches the whole group (the JVM ignores SIGINT); a supervisor's SIGTERM, the pid
            (os.killpg if group else os.kill)(child.pid, interrupt)
        _out, err = child.communicate(timeout=180)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return child.returncode, [line for line in err.splitlines() if line.strip() and not line.startswith(NOISE)]


def wait_for_an_epoch_in_flight(ck, timeout: float = 60.0) -> int:
    """The epoch Spark has planned (its offset log) and regional not yet recorded: the child's UDF holds it 2 s."""
    import regional

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        planned = max((int(p.name) for p in (ck / "offsets").iterdir() if p.name.isdigit()), default=-1)
        recorded = regional.status(ck).last_epoch
        if recorded is not None and planned > recorded:
            return planned
        time.sleep(0.05)
    raise AssertionError(f"no epoch in flight within {timeout:.0f} s")


# 40 s idle: a driver of its own
def test_a_regional_error_is_one_line_from_regional_and_no_traceback(tmp_path):
    code, lines = run_child("fail", tmp_path)
    assert code != 0
    assert len(lines) == 1, "\n".join(lines)
    assert lines[0].startswith("regional: ") and "001.txt" in lines[0], lines[0]


# 83 s each in the fresh clone's run: a driver of its own, then the same query started again in the shared session
@pytest.mark.parametrize(("sent", "group", "status", "line"), [
    (signal.SIGINT, True, 130, "regional: interrupted (Ctrl-C)"),
    (signal.SIGTERM, False, 143, "regional: terminated (SIGTERM)"),
    # the campaign's: SIGTERM to the whole group reaches the JVM too, which stops Spark at once (no final epoch)
    pytest.param(signal.SIGTERM, True, 143, "regional: terminated (SIGTERM)", marks=pytest.mark.campaign)])
def test_a_signal_stops_the_query_gracefully_in_one_line_and_starting_again_loses_and_doubles_nothing(
        spark, tmp_path, sent, group, status, line):
    """The stop on a signal is regional.stop's: the signal comes while an epoch is in flight (planned in Spark's
    offset log, not recorded), and that epoch is recorded before the process ends (a kill leaves it unrecorded).
    A SIGTERM to the whole group stops the JVM as well: one line all the same, and the restart loses nothing."""
    import regional

    code, lines = run_child("wait", tmp_path, interrupt=sent, group=group)
    assert code in (status, -sent), (code, lines)  # -2: Python ends on an uncaught KeyboardInterrupt by SIGINT
    assert len(lines) == 1, "\n".join(lines)
    assert lines[0].startswith(line) and "goes on where it stopped" in lines[0]
    in_flight = int((tmp_path / "in-flight").read_text())
    # Sent to the group (a terminal's Ctrl-C), the signal reaches Spark's Python workers too, and the epoch they
    # were running may fail (then the next start runs it again): the finished epoch is checked where the signal
    # reaches the driver alone (the fresh clone's run at 292fa66 failed the group case this way, once in three)
    if not group:
        assert (regional.status(tmp_path / "ck").last_epoch or -1) >= in_flight, "the epoch in flight was not finished"
    (tmp_path / "in" / "a" / "002.txt").write_text("".join(f"a-{i}\n" for i in range(5, 8)))  # and more input
    query = (regional_stream(spark, tmp_path / "in", tmp_path / "ck").writeStream.format("regional")
             .option("target", "delta").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ck")).option("keepRegionColumns", "true")
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert_exactly_once(tmp_path / "out", {"a": [(i, f"a-{i}") for i in range(8)]}, spark)
