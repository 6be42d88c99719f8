"""Python workers freeze what their imports made, so pyspark's collection after each task stays cheap."""

import gc
import sys
import types

import pytest

from regional.spark import worker_process


@pytest.fixture()
def fresh(monkeypatch):
    monkeypatch.setattr(worker_process, "_modules_at_last_freeze", 0)
    yield
    gc.unfreeze()


def test_a_task_freezes_when_modules_were_imported_since_the_last_freeze(fresh, monkeypatch):
    gc.unfreeze()
    worker_process.freeze_imports()
    frozen = gc.get_freeze_count()
    assert frozen > 1000  # pytest, pyarrow, pyspark: the worker's long-lived objects
    keep = [[i] for i in range(500)]  # a task's own objects, made after the freeze
    worker_process.freeze_imports()  # no new module: nothing more is frozen
    assert gc.get_freeze_count() == frozen
    monkeypatch.setitem(sys.modules, "regional_test_new_module", types.ModuleType("regional_test_new_module"))
    worker_process.freeze_imports()
    assert gc.get_freeze_count() >= frozen + len(keep)


def test_regional_gc_freeze_off_leaves_the_collector_alone(fresh, monkeypatch):
    gc.unfreeze()
    monkeypatch.setenv("REGIONAL_GC_FREEZE", "off")
    worker_process.freeze_imports()
    assert gc.get_freeze_count() == 0
