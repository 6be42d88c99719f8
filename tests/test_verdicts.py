"""The user's and the target's verdict (issue 55): ``deadLetterOn``, ``outageOn``, ``regional.PoisonRecord``,
``regional.Outage`` and a target's ``RowsInvalid``, read from the JVM shim's failure records. Pure, no Spark."""

from __future__ import annotations

import builtins
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
from support import python_traceback

PY = "org.apache.spark.api.python.PythonException"


def line_of(exc: BaseException) -> str:
    """The exception line as the JVM shim keeps it: Python's last unindented traceback line."""
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def raised(exc: BaseException) -> str:
    """The traceback Python prints for ``exc`` raised (what a Python worker sends the JVM)."""
    try:
        raise exc
    except BaseException as caught:
        return "".join(traceback.format_exception(caught))


def python_failure(attempt: int, description: str) -> TaskFailure:
    return TaskFailure(0, attempt, "1", PY, description.strip().splitlines()[-1], description)


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
    assert failure_class(TaskFailure(0, 0, "1", PY, line, python_traceback(line))) == cls
    assert failure_class(TaskFailure(0, 0, "1", PY, line)) is None  # no description (an older shim): nothing named


def test_the_class_of_real_exception_lines_and_of_jvm_failures():
    import json

    try:
        json.loads("{")
    except ValueError as exc:
        assert failure_class(python_failure(0, raised(exc))) == "json.decoder.JSONDecodeError"
    assert failure_class(python_failure(0, raised(BadRecord()))) == f"{__name__}.BadRecord"
    assert failure_class(python_failure(0, raised(regional.PoisonRecord("a\nb")))) == \
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
    return [TaskFailure(0, k, "1", cls, line, python_traceback(line) if cls == PY else None)
            for k, line in enumerate(lines)]


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


def test_the_targets_verdict_needs_records_beside_it_passing_the_target_in_the_same_epoch():
    """The review's drain: a fault of the query or the table (a column left out, a rule changed by DDL) makes the
    target refuse every row with RowsInvalid. Dead-lettered at once, each region would drain one record an epoch,
    under the per-epoch brake. The target's verdict counts only while neighbours pass the same target now."""
    plain = Settings(dead_letter_path="/dead", region_attempts=2, dead_letter_retries=4)
    refused = [line_of(RowsInvalid("1 of 1 rows break the Delta table's CHECK constraint c"))] * 2
    plan, states = alone(plain)
    record = decided(plan, states, refused)
    a = record.regions["a"]
    assert not record.dead_lettered and a.committed_offset == 3
    assert "the target's verdict needs records of its region beside it to pass the target" in a.reason
    plan, states = alone(plain)
    assert decided(plan, states, refused, neighbours_passed=True).dead_lettered["a"].offset == 3
    # the user's own verdict needs no neighbours (a bad file has none): the user named the class
    plan, states = alone(ISOLATING)
    assert decided(plan, states, ["ValueError: bad"] * 2).dead_lettered["a"].offset == 3


def test_a_target_refusing_every_row_drains_nothing_over_many_epochs():
    """Replays plan and decide: three regions of 64 records, every row refused by the target (RowsInvalid), probes
    refused alike (they run through the same target). Nothing is dead-lettered, whatever the epochs."""
    from regional.store.model import EpochKind, EpochRecord

    plain = Settings(dead_letter_path="/dead", region_attempts=2, dead_letter_retries=0)
    refused = line_of(RowsInvalid("every row breaks the table's CHECK constraint c"))
    states: dict[str, RegionState] = {}
    previous = None
    for epoch in range(120):
        plan = plan_epoch(epoch, "q", "/ck", states, dict.fromkeys("abc", 64), plain, now=float(epoch * 1_000))
        outcomes, failed = {}, {}
        for i, rr in enumerate(plan.regions):  # every range fails on every attempt; the last attempt quarantines
            status = Outcome.DEAD_LETTERED if rr.isolated else Outcome.QUARANTINED
            outcomes[rr.region] = RegionOutcome(rr.region, status, rr.end if rr.isolated else rr.start,
                                                dead_letter=b"r" if rr.isolated else None)
            failed[i] = failures(refused, refused)
        previous = decide(plan, with_failure_causes(plan, outcomes, failed), previous, now=float(epoch * 1_000))
        states = dict(previous.regions)
        assert not previous.dead_lettered, (epoch, previous.dead_lettered)
    assert isinstance(previous, EpochRecord) and previous.kind in tuple(EpochKind)
    assert all(s.committed_offset == 0 and s.dead_letters == 0 for s in states.values())


def test_a_bare_name_never_names_a_jvm_failure():
    """deadLetterOn=AssertionError is meant for Python's assert: java.lang.AssertionError (the JVM's) is not it, nor
    does SparkException name a crashed Python worker. A JVM class is named by its fully qualified name only."""
    s = Settings(dead_letter_path="/dead", region_attempts=2,
                 dead_letter_on=("AssertionError", "NotImplementedError", "java.lang.ArithmeticException"))
    assert verdict_of(s, failures("boom", "boom", cls="java.lang.AssertionError")) is None
    assert verdict_of(s, failures("x", "x", cls="scala.NotImplementedError")) is None
    assert verdict_of(s, failures("AssertionError: x", "AssertionError: y")).poison  # Python's own
    assert verdict_of(s, failures("/ by zero", "/ by zero", cls="java.lang.ArithmeticException")).poison


@pytest.mark.parametrize("name", ["Exception", "builtins.BaseException", "Py4JJavaError",
                                  "org.apache.spark.SparkException", "PythonException", "java.lang.Throwable"])
def test_a_name_every_failure_carries_is_refused_in_dead_letter_on(name):
    with pytest.raises(RegionalConfigError, match="names every failure"):
        resolve_settings({}, {"deadLetterOn": name}, {})
    assert resolve_settings({}, {"outageOn": name}, {}).outage_on  # as an outage it only delays: allowed


def test_a_class_is_read_only_where_the_traceback_leaves_no_doubt():
    """The review: a message of several lines, a note or a traceback inside a message can end with another class's
    line (``RuntimeError`` whose message ends "ValueError: ...", with deadLetterOn=ValueError: dead-lettered on its
    first failure alone). The class is read from the whole traceback, and only where it is one line."""
    upstream = RuntimeError("enrichment service answered 500:\nTraceback (most recent call last):\n"
                            '  File "svc.py", line 9, in handle\nValueError: invalid literal for int()')
    assert failure_class(python_failure(0, raised(upstream))) is None
    assert failure_class(python_failure(0, raised(RuntimeError("upstream said:\nValueError: x")))) is None
    noted = ConnectionResetError("reset by peer")
    noted.add_note("ValueError: retry with backoff")
    assert failure_class(python_failure(0, raised(noted))) is None
    group = vars(builtins)["ExceptionGroup"]("two", [ValueError("a"), KeyError("b")])  # Python 3.11's
    assert failure_class(python_failure(0, raised(group))) is None
    # chained exceptions: the last raised is the class, as Python prints it
    try:
        try:
            raise KeyError("k")
        except KeyError as inner:
            raise ValueError("bad record") from inner
    except ValueError as outer:
        assert failure_class(python_failure(0, raised(outer))) == "ValueError"
    try:
        try:
            raise ValueError("v")
        except ValueError:
            raise ConnectionError("down") from None
    except ConnectionError as suppressed:
        assert failure_class(python_failure(0, raised(suppressed))) == "ConnectionError"
    try:
        try:
            raise ValueError("v")
        except ValueError:
            raise ConnectionError("down")  # noqa: B904 - the implicit chain is the case
    except ConnectionError as implicit:
        assert failure_class(python_failure(0, raised(implicit))) == "ConnectionError"
    # with deadLetterOn=ValueError, the RuntimeError above is no verdict: the evidence rule decides
    s = Settings(dead_letter_path="/dead", region_attempts=2, dead_letter_on=("ValueError",))
    assert verdict_of(s, [python_failure(k, raised(upstream)) for k in range(2)]) is None


def test_the_class_of_a_description_as_spark_4_2_writes_it():
    """What the shim records for a UDF's exception (ExceptionFailure.description of Spark 4.2.1's PythonException,
    seen in a real run): the first traceback header follows Spark's own words on its line, and Spark's SQLSTATE
    follows the exception line."""
    spark_42 = ("[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most recent call "
                "last):\n  File \"/site-packages/pyspark/python/lib/pyspark.zip/pyspark/worker.py\", line 3602, in main"
                "\n    func, profiler, deserializer, serializer = read_udfs(\n"
                "                                               ^^^^^^^^^^\n"
                "  File \"/tmp/udf.py\", line 7, in parse\n    raise ValueError(f\"cannot parse {v}\")\n"
                "ValueError: cannot parse 0\n SQLSTATE: 38000")
    assert failure_class(python_failure(0, spark_42)) == "ValueError"
    # a message of two lines in the same frame: no class
    two = spark_42.replace("ValueError: cannot parse 0", "RuntimeError: upstream said:\nValueError: x")
    assert failure_class(python_failure(0, two)) is None
