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


def run_child(mode: str, work, interrupt: signal.Signals | None = None) -> tuple[int, list[str]]:
    child = subprocess.Popen([sys.executable, "-m", "integration.console_child", mode, str(work)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # CHILD-RUNNING, once its first epoch is recorded
        assert "CHILD-RUNNING" in line, (line, child.stderr.read() if child.stderr else "")
        if interrupt is not None:
            time.sleep(2)
            os.killpg(child.pid, interrupt)  # as a terminal's Ctrl-C or a service manager: the whole group
        _out, err = child.communicate(timeout=180)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return child.returncode, [line for line in err.splitlines() if line.strip() and not line.startswith(NOISE)]


# 40 s idle: a driver of its own
def test_a_regional_error_is_one_line_from_regional_and_no_traceback(tmp_path):
    code, lines = run_child("fail", tmp_path)
    assert code != 0
    assert len(lines) == 1, "\n".join(lines)
    assert lines[0].startswith("regional: ") and "001.txt" in lines[0], lines[0]


# 83 s each in the fresh clone's run: a driver of its own, then the same query started again in the shared session
@pytest.mark.parametrize(("sent", "status", "line"), [
    (signal.SIGINT, 130, "regional: interrupted (Ctrl-C)"), (signal.SIGTERM, 143, "regional: terminated (SIGTERM)")])
def test_a_signal_is_one_line_and_starting_again_loses_and_doubles_nothing(spark, tmp_path, sent, status, line):
    code, lines = run_child("wait", tmp_path, interrupt=sent)
    assert code in (status, -sent), code
    assert len(lines) == 1, "\n".join(lines)
    assert lines[0].startswith(line) and "goes on where it stopped" in lines[0]
    (tmp_path / "in" / "a" / "002.txt").write_text("".join(f"a-{i}\n" for i in range(5, 8)))  # and more input
    query = (regional_stream(spark, tmp_path / "in", tmp_path / "ck").writeStream.format("regional")
             .option("target", "delta").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ck")).option("keepRegionColumns", "true")
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert_exactly_once(tmp_path / "out", {"a": [(i, f"a-{i}") for i in range(8)]}, spark)
