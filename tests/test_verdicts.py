"""The user's and the target's verdict (issue 55): ``deadLetterOn``, ``outageOn``, ``regional.PoisonRecord``,
``regional.Outage`` and a target's ``RowsInvalid``, read from the JVM shim's failure records. Pure, no Spark."""

from __future__ import annotations

import traceback

import pytest

import regional
from regional.errors import RegionalConfigError, RegionalDeadLetterLimitError
from regional.protocol.decide import (
    UNKNOWN_CAUSE,
    Outcome,
    RegionOutcome,
    class_matches,
    decide,
    failure_class,
    verdict_of,
    with_failure_causes,
)
from regional.protocol.plan import plan_epoch
from regional.protocol.settings import Settings, resolve_settings
from regional.store.model import RegionState, TaskFailure
from regional.targets.base import RowsInvalid, RowsRejected
from regional.targets.postgres.target import rows_verdict

PY = "org.apache.spark.api.python.PythonException"


def line_of(exc: BaseException) -> str:
    """The exception line as the JVM shim keeps it: Python's last unindented traceback line."""
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


class BadRecord(Exception):
    pass


@pytest.mark.parametrize(("line", "cls"), [
    ("ValueError: bad", "ValueError"),
    ("json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)", "json.decoder.JSONDecodeError"),
    ("mymodule.MyError", "mymodule.MyError"),  # an empty message: Python prints the class alone
    ("mymodule.MyError:", "mymodule.MyError"),
    ("pkg.build.<locals>.Local: x", "pkg.build.<locals>.Local"),
    ("KeyError: 'a: b'", "KeyError"),
    ("   ValueError: padded   ", "ValueError"),
    ("  File \"x.py\", line 3, in f", None),  # no exception line
    ("something went wrong", None),
    ("pkg.f.<locals>: x", None),
    ("", None),
])
def test_the_class_of_pythons_exception_line(line, cls):
    assert failure_class(TaskFailure(0, 0, "1", PY, line)) == cls


def test_the_class_of_real_exception_lines_and_of_jvm_failures():
    import json

    try:
        json.loads("{")
    except ValueError as exc:
        assert failure_class(TaskFailure(0, 0, "1", PY, line_of(exc))) == "json.decoder.JSONDecodeError"
    assert failure_class(TaskFailure(0, 0, "1", PY, line_of(BadRecord()))) == f"{__name__}.BadRecord"
    assert failure_class(TaskFailure(0, 0, "1", PY, line_of(regional.PoisonRecord("a\nb")))) == \
        "regional.errors.PoisonRecord"  # its message is one line, so the shim keeps the class line
    assert failure_class(TaskFailure(0, 0, "1", "java.lang.ArithmeticException", "/ by zero")) == \
        "java.lang.ArithmeticException"
    assert failure_class(TaskFailure(0, 0, "1", "ExecutorLostFailure", "lost")) == "ExecutorLostFailure"


@pytest.mark.parametrize(("name", "cls", "match"), [
    ("JSONDecodeError", "json.decoder.JSONDecodeError", True),
    ("json.JSONDecodeError", "json.decoder.JSONDecodeError", True),
    ("json.decoder.JSONDecodeError", "json.decoder.JSONDecodeError", True),
    ("decoder.JSONDecodeError", "json.decoder.JSONDecodeError", False),  # a module path is matched from its start
    ("ValueError", "json.decoder.JSONDecodeError", False),  # a subclass is matched by its own name only
    ("ValueError", "ValueError", True),
    ("mymodule.ValueError", "ValueError", False),
    ("regional.PoisonRecord", "regional.errors.PoisonRecord", True),
    ("ArithmeticException", "java.lang.ArithmeticException", True),
])
def test_what_a_name_matches(name, cls, match):
    assert class_matches(name, cls) is match


def test_the_options_resolve_and_round_trip_and_old_plans_lack_them():
    s = resolve_settings({"spark.regional.outageOn": "ConnectionError, TimeoutError"},
                         {"deadLetterOn": " ValueError,json.JSONDecodeError,, builtins.KeyError "}, {})
    assert s.dead_letter_on == ("ValueError", "json.JSONDecodeError", "KeyError")
    assert s.outage_on == ("ConnectionError", "TimeoutError")
    assert Settings.from_json(s.to_json()) == s
    old = {k: v for k, v in s.to_json().items() if k not in ("dead_letter_on", "outage_on")}
    assert Settings.from_json(old).dead_letter_on == () and Settings.from_json(old).outage_on == ()
    assert resolve_settings({}, {}, {}).dead_letter_on == ()


@pytest.mark.parametrize(("poison", "outage", "message"), [
    ("ValueError", "ValueError", r"'ValueError' \(deadLetterOn\) and 'ValueError' \(outageOn\)"),
    ("JSONDecodeError", "json.decoder.JSONDecodeError", "can name the same exception class"),
    ("x, mymod.E", "E", r"'mymod.E' \(deadLetterOn\) and 'E' \(outageOn\)"),
    ("regional.Outage", "", r"regional.Outage' \(deadLetterOn\) and regional.errors.Outage \(always an outage\)"),
    ("", "PoisonRecord", "regional.errors.PoisonRecord .always the record's fault. and 'PoisonRecord'"),
    ("", "RowsInvalid", "cannot change sides"),
    ("Value Error", "", r"deadLetterOn: 'Value Error' is not an exception class name"),
    ("", "a..b", r"outageOn: 'a..b' is not an exception class name"),
    ("1Error", "", "not an exception class name"),
])
def test_bad_or_conflicting_names_are_refused_naming_them(poison, outage, message):
    with pytest.raises(RegionalConfigError, match=message):
        resolve_settings({}, {"deadLetterOn": poison, "outageOn": outage}, {})


def test_different_classes_of_one_simple_name_do_not_conflict():
    s = resolve_settings({}, {"deadLetterOn": "a.Error", "outageOn": "b.Error, java.lang.Inner$Error"}, {})
    assert s.dead_letter_on == ("a.Error",) and s.outage_on == ("b.Error", "java.lang.Inner$Error")


ISOLATING = Settings(dead_letter_path="/dead", region_attempts=2, dead_letter_retries=4,
                     dead_letter_retry_backoff_s=60.0, dead_letter_on=("ValueError", "json.JSONDecodeError"),
                     outage_on=("ConnectionError",))


def failures(*lines: str, cls: str = PY) -> list[TaskFailure]:
    return [TaskFailure(0, k, "1", cls, line) for k, line in enumerate(lines)]


def test_a_verdict_needs_every_attempt_to_agree_and_an_outage_needs_one():
    poison = verdict_of(ISOLATING, failures("ValueError: a", "json.decoder.JSONDecodeError: b"))
    assert poison is not None and poison.poison
    assert "ValueError, named by deadLetterOn (ValueError)" in poison.why
    assert verdict_of(ISOLATING, failures("ValueError: a")) is None  # attempt 1 unrecorded: not known
    assert verdict_of(ISOLATING, failures("ValueError: a", "KeyError: b")) is None  # one unnamed: evidence
    assert verdict_of(ISOLATING, failures("ValueError: a", "some text")) is None
    outage = verdict_of(ISOLATING, failures("ValueError: a", "ConnectionError: refused"))
    assert outage is not None and not outage.poison and "named by outageOn (ConnectionError)" in outage.why
    assert verdict_of(ISOLATING, []) is None
    assert verdict_of(Settings(dead_letter_on=("ValueError",)), failures("ValueError: a", "ValueError: b")) is None
    # regional's own classes need no option
    plain = Settings(dead_letter_path="/dead", region_attempts=2)
    assert verdict_of(plain, failures(*[line_of(regional.PoisonRecord("x"))] * 2)).poison
    assert not verdict_of(plain, failures(line_of(regional.Outage("down")), "ValueError: a")).poison
    rows = verdict_of(plain, failures(*[line_of(RowsInvalid("target=postgres: refused"))] * 2))
    assert rows.poison and "the target's verdict about the row" in rows.why
    assert verdict_of(plain, failures(*[line_of(RowsRejected("refused"))] * 2)) is None  # evidence, as before
    assert verdict_of(plain, failures("ValueError: a", "ValueError: b")) is None


def alone(settings: Settings, state: RegionState | None = None, epoch: int = 5):
    """Region a isolating its record at offset 3 (alone in the plan), b with work."""
    states = {"a": state or RegionState(3, 4, isolating=(3, 4)), "b": RegionState(0, 4)}
    plan = plan_epoch(epoch, "q", "/ck", states, {"a": 10, "b": 5}, settings, now=1_000.0)
    assert plan.regions[0].isolated
    return plan, states


def decided(plan, states, lines, cls=PY, neighbours_passed=False):
    from regional.store.model import EpochKind, EpochRecord

    outcomes = {"a": RegionOutcome("a", Outcome.DEAD_LETTERED, 4, dead_letter=b"r",
                                   neighbours_passed=neighbours_passed),
                "b": RegionOutcome("b", Outcome.WRITTEN, 5, 5)}
    named = with_failure_causes(plan, outcomes, {0: failures(*lines, cls=cls)} if lines else {})
    return decide(plan, named, EpochRecord(plan.epoch - 1, EpochKind.GLOBAL, {}, {}, states), now=1_000.0)


def test_a_named_poison_is_dead_lettered_on_its_first_failure_alone():
    plan, states = alone(ISOLATING)
    record = decided(plan, states, ["ValueError: cannot parse", "ValueError: cannot parse"])
    assert record.dead_lettered["a"].offset == 3 and record.dead_lettered["a"].error == "ValueError: cannot parse"
    assert record.regions["a"].committed_offset == 4
    # the same failure without deadLetterOn waits for evidence (this epoch is its first failure alone)
    plan, states = alone(Settings(dead_letter_path="/dead", region_attempts=2, dead_letter_retries=4))
    record = decided(plan, states, ["ValueError: cannot parse", "ValueError: cannot parse"])
    assert not record.dead_lettered and record.regions["a"].committed_offset == 3


def test_a_named_outage_is_never_dead_lettered_even_on_a_full_sandwich():
    """Records beside it passed between two failures alone, its tries are used up: the evidence rule would
    dead-letter it now; named by outageOn, it waits, and its evidence starts again."""
    ripe = RegionState(3, 4, isolating=(3, 4), failed_alone=4, failed_alone_at=900.0, alone_since=2, probe_passed=3)
    plan, states = alone(ISOLATING, ripe)
    record = decided(plan, states, ["ConnectionError: refused", "ConnectionError: refused"])
    a = record.regions["a"]
    assert not record.dead_lettered and a.committed_offset == 3 and a.alone_since is None and a.alone_waits == 1
    assert "with ConnectionError, named by outageOn (ConnectionError): an outage, never dead-lettered" in a.reason
    assert a.consecutive_failures == 1
    # records beside it passing now: the region's progress, as for a failure alone that is no try (not counted)
    plan, states = alone(ISOLATING, ripe)
    a = decided(plan, states, ["ConnectionError: refused"] * 2, neighbours_passed=True).regions["a"]
    assert a.consecutive_failures == 0 and a.probe_passed == 5 and a.alone_since is None
    # unnamed, the same evidence dead-letters it: the test above is about outageOn
    plan, states = alone(ISOLATING, ripe)
    assert decided(plan, states, ["TimeoutError: slow", "TimeoutError: slow"]).dead_lettered["a"].offset == 3


def test_without_failure_records_the_evidence_rule_decides_and_says_why():
    plan, states = alone(ISOLATING)
    record = decided(plan, states, [])
    a = record.regions["a"]
    assert not record.dead_lettered and a.committed_offset == 3
    assert UNKNOWN_CAUSE in a.reason and "deadLetterOn and outageOn cannot apply without it" in a.reason


def test_the_brake_still_applies_to_named_poison():
    s = Settings(dead_letter_path="/dead", region_attempts=1, max_dead_letters_per_epoch=1, dead_letter_on=("E",))
    states = {r: RegionState(3, 4, isolating=(3, 4)) for r in "ab"}
    plan = plan_epoch(5, "q", "/ck", states, dict.fromkeys("ab", 10), s)
    outcomes = {r: RegionOutcome(r, Outcome.DEAD_LETTERED, 4, dead_letter=b"r") for r in "ab"}
    named = with_failure_causes(plan, outcomes, {i: failures("E: bad") for i in range(2)})
    with pytest.raises(RegionalDeadLetterLimitError, match="would dead-letter 2 records"):
        decide(plan, named, None, now=1.0)


@pytest.mark.parametrize(("state", "constraint", "kind"), [
    ("22P02", None, RowsInvalid),  # invalid text representation
    ("22003", None, RowsInvalid),  # numeric value out of range
    ("22001", None, RowsInvalid),  # value too long
    ("23502", "t_x_not_null", RowsInvalid),  # not null violation
    ("23514", "t_x_check", RowsInvalid),  # a CHECK constraint
    ("23514", None, RowsRejected),  # no partition for the row (yet): perhaps not its own fault
    ("23505", "t_pkey", RowsRejected),  # unique: other rows
    ("23503", "t_fk", RowsRejected),  # foreign key: other rows, perhaps not loaded yet
    ("23P01", "t_excl", RowsRejected),
    ("P0001", None, RowsRejected),  # a trigger's RAISE
    ("P0004", None, RowsRejected),  # a trigger's ASSERT
    ("42501", None, None),  # a privilege (row-level security refuses COPY itself: 0A000)
    ("0A000", None, None),
    ("54000", None, RowsRejected),  # index row too large
    ("08006", None, None), ("08003", None, None), ("57P01", None, None), ("53100", None, None),
    ("53200", None, None), ("40001", None, None), ("40P01", None, None), ("55P03", None, None),
    ("57014", None, None), ("42P01", None, None), ("", None, None), ("54001", None, None),
])
def test_which_postgres_errors_are_about_the_row(state, constraint, kind):
    assert rows_verdict(state, constraint) is kind
