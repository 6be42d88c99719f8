"""The target contract as users wrote it before Target was abstract keeps working (python:<module>:<Class>)."""

from __future__ import annotations

import sys
import types

import pytest

from regional.errors import RegionalConfigError
from regional.targets import EpochReport, RegionalTarget, Target, load_target

REPORT = EpochReport(3, "regional", {"a": (0, 2)}, {"b": (1, "down")}, {"a": 2})
calls: list = []


class Plain:  # the documented plain class: commit(epoch, handles), no report
    def __init__(self, options): pass
    def prepare(self, epoch, region, batches): return "h"
    def commit(self, epoch, handles): calls.append(("plain", epoch, handles))
    def abort(self, epoch, handles): pass


class PlainWantsReport(Plain):  # the old opt-in: wants_report = True
    wants_report = True
    def commit(self, epoch, handles, report=None): calls.append(("wants", epoch, report))


class TwoArgTarget(Target):  # a subclass written against the old Protocol's two-argument commit
    def prepare(self, epoch, region, batches): return "h"
    def commit(self, epoch, handles): calls.append(("two", epoch, handles))
    def abort(self, epoch, handles): pass


class OldSubclass(RegionalTarget):  # subclassed the old RegionalTarget, never overrode abort
    def prepare(self, epoch, region, batches): return "h"
    def commit(self, epoch, handles, report=None): calls.append(("old", epoch, report))


def factory(options):  # not a class: any callable that builds the target
    return Plain(options)


@pytest.fixture(autouse=True)
def module():
    mod = types.ModuleType("user_targets")
    for obj in (Plain, PlainWantsReport, TwoArgTarget, OldSubclass, factory):
        setattr(mod, obj.__name__, obj)
    mod.NotCallable = 3
    sys.modules["user_targets"] = mod
    calls.clear()
    yield
    del sys.modules["user_targets"]


def commit_through(name: str) -> list:
    target = load_target({"target": f"python:user_targets:{name}"})
    assert isinstance(target, Target)
    target.commit(3, {"a": "h"}, report=REPORT)  # as the coordinator calls it
    return calls


def test_each_way_users_wrote_targets_is_called_as_it_was_written():
    assert commit_through("Plain") == [("plain", 3, {"a": "h"})]
    calls.clear()
    assert commit_through("PlainWantsReport") == [("wants", 3, REPORT)]
    calls.clear()
    assert commit_through("TwoArgTarget") == [("two", 3, {"a": "h"})]
    calls.clear()
    assert commit_through("OldSubclass") == [("old", 3, REPORT)]
    calls.clear()
    assert commit_through("factory") == [("plain", 3, {"a": "h"})]


def test_what_cannot_be_a_target_is_refused_at_start():
    with pytest.raises(RegionalConfigError, match="has no class 'NotCallable'"):
        load_target({"target": "python:user_targets:NotCallable"})
    with pytest.raises(RegionalConfigError, match="has no class 'Missing'"):
        load_target({"target": "python:user_targets:Missing"})
