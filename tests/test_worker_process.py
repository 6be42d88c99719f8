"""Python workers freeze what their imports made, so pyspark's collection after each task stays cheap."""

import sys
import types

import pytest

from regional.spark import worker_process


@pytest.fixture()
def freezes(monkeypatch):
    """Counts gc.freeze calls (the collector's own count moves whenever another thread frees an old object)."""
    calls: list[int] = []
    monkeypatch.setattr(worker_process, "_modules_at_last_freeze", 0)
    monkeypatch.setattr(worker_process.gc, "freeze", lambda: calls.append(len(sys.modules)))
    return calls


def test_a_task_freezes_only_when_modules_were_imported_since_the_last_freeze(freezes, monkeypatch):
    monkeypatch.delenv("REGIONAL_GC_FREEZE", raising=False)
    worker_process.freeze_imports()
    worker_process.freeze_imports()  # no new module: no freeze
    assert len(freezes) == 1
    monkeypatch.setitem(sys.modules, "regional_test_new_module", types.ModuleType("regional_test_new_module"))
    worker_process.freeze_imports()
    worker_process.freeze_imports()
    assert len(freezes) == 2 and freezes[1] == freezes[0] + 1


def test_regional_gc_freeze_off_leaves_the_collector_alone(freezes, monkeypatch):
    monkeypatch.setenv("REGIONAL_GC_FREEZE", "off")
    worker_process.freeze_imports()
    assert freezes == []


def test_a_cut_input_outside_a_spark_task_leaves_stderr_alone():
    before = sys.stderr
    worker_process.quiet_after_cut_input()  # no TaskContext: a driver, a test
    assert sys.stderr is before
