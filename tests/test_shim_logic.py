"""The Python half of the JVM shim's features, without Spark: what the shim writes into the store and
how the driver uses it (failure causes, all-or-nothing epochs, referenced epochs, the version switch)."""

import pytest

from regional.coordinator import commit_epoch
from regional.errors import RegionalConfigError, RegionalPlanError
from regional.protocol.decide import Outcome, RegionOutcome, TaskOutcome, outcomes_all_or_nothing, with_failure_causes
from regional.protocol.plan import plan_epoch
from regional.protocol.settings import Settings
from regional.spark.reader import RegionalStreamReader
from regional.spark.shim import FEATURES, ShimState, check_spark_version
from regional.store import EpochKind, EpochRecord, RegionState, Standing, Store
from regional.store.model import TaskFailure
from support import QUERY, MemoryTarget, write_store_file


def test_the_version_switch_refuses_other_spark_lines():
    check_spark_version("4.2.0")
    check_spark_version("4.2.3")
    for other in ("4.1.0", "4.0.1", "3.5.3", "4.20.0"):
        with pytest.raises(RegionalConfigError, match=r"supports Spark 4\.2\.x and this session runs Spark"):
            check_spark_version(other)


def test_shim_state_lists_what_is_off():
    assert ShimState(True, frozenset(FEATURES), None).off == []
    off = ShimState(False, frozenset(), "put the jar on the classpath").off
    assert "offset-log keep-alive of referenced epochs" in off and len(off) == len(FEATURES)


def test_a_quarantined_region_gets_the_cause_of_its_last_failed_attempt():
    plan = plan_epoch(3, QUERY, "/ck", {}, {"a": 5, "b": 5}, Settings())
    outcomes = {"a": RegionOutcome("a", Outcome.WRITTEN, 5, 5),
                "b": RegionOutcome("b", Outcome.QUARANTINED, 0, reason="quarantined")}
    failures = {1: [TaskFailure(1, 0, "driver", "org.apache.spark.api.python.PythonException", "ValueError: bad 1"),
                    TaskFailure(1, 1, "7", "org.apache.spark.api.python.PythonException", "ValueError: bad 2")],
                0: [TaskFailure(0, 0, "driver", "java.io.IOException", "retried fine")]}
    named = with_failure_causes(plan, outcomes, failures)
    assert named["b"].reason == "quarantined after 2 failed attempt(s); attempt 1 on executor 7: ValueError: bad 2"
    assert named["a"] == outcomes["a"]  # a retry that succeeded is no fallback


def test_an_all_or_nothing_epoch_commits_every_region_or_none():
    plan = plan_epoch(0, QUERY, "/ck", {}, {"a": 4, "b": 2, "c": 0}, Settings(enabled=False))
    mixed = [TaskOutcome(0, 0, Outcome.WRITTEN, rows=3, handle="h0", region_rows={"a": 2, "b": 1}),
             TaskOutcome(1, 0, Outcome.WRITTEN, rows=3, handle="h1", region_rows={"a": 2, "b": 1})]
    done = outcomes_all_or_nothing(plan, mixed)
    assert {r: (o.status, o.end, o.rows) for r, o in done.items()} == {
        "a": (Outcome.WRITTEN, 4, 4), "b": (Outcome.WRITTEN, 2, 2)}
    failed = outcomes_all_or_nothing(plan, [mixed[0], None])
    assert {o.status for o in failed.values()} == {Outcome.FAILED} and failed["a"].end == 0
    with pytest.raises(RegionalPlanError, match="did not plan"):
        outcomes_all_or_nothing(plan, [TaskOutcome(0, 0, Outcome.WRITTEN, rows=1, region_rows={"zz": 1})])


def test_a_mixed_epoch_publishes_every_task_handle_once(tmp_path):
    store, target = Store(tmp_path), MemoryTarget()
    plan = plan_epoch(0, store.open_query(), str(store.checkpoint), {}, {"a": 4, "b": 2}, Settings(enabled=False))
    reports = [TaskOutcome(0, 0, Outcome.WRITTEN, rows=3, handle="h0", region_rows={"a": 2, "b": 1}),
               TaskOutcome(1, 0, Outcome.WRITTEN, rows=3, handle="h1", region_rows={"a": 2, "b": 1})]
    record = commit_epoch(plan, reports, store, target, mixed=True)
    assert record.kind is EpochKind.GLOBAL and target.commits == {0: {"#0": "h0", "#1": "h1"}}
    assert {r: s.committed_offset for r, s in record.regions.items()} == {"a": 4, "b": 2}


def test_the_store_lists_referenced_epochs_for_the_shim(tmp_path):
    store = Store(tmp_path)
    regions = {"a": RegionState(5, 7), "b": RegionState(3, 4, 2, Standing.FALLEN_BACK, "down"),
               "c": RegionState(0, None, 1, Standing.QUARANTINED, "poison")}  # ref_epoch -1: nothing to keep
    store.write_record(EpochRecord(8, EpochKind.REGIONAL, {}, {}, regions))
    assert (tmp_path / "regional" / "referenced-epochs").read_text().splitlines()[1] == "[4]"
    assert store.referenced_epochs() == [4]
    store.write_record(EpochRecord(9, EpochKind.GLOBAL, {}, {}, {"a": RegionState(5, 9)}))
    assert store.referenced_epochs() == []


def test_the_store_reads_what_the_shim_writes(tmp_path):
    store = Store(tmp_path)
    assert store.read_query_plan() is None and store.read_failures(2) == {}
    # the JVM shim writes these (RegionalShim.writeStoreFile), in the store's file format
    write_store_file(tmp_path / "regional" / "query-plan.json", "query-plan",
                {"regional_epochs": False, "operator": "Repartition", "reason": "repartition(2) mixes"})
    check = store.read_query_plan()
    assert check is not None and not check.regional_epochs and check.operator == "Repartition"
    failures = tmp_path / "regional" / "failures" / "2"
    for attempt in (1, 0):
        write_store_file(failures / f"3-{attempt}.json", "failure",
                    {"partition": 3, "attempt": attempt, "executor": "driver", "exception_class": "X",
                     "message": f"m{attempt}"})
    (failures / ".3-2.json.tmp").write_text("{torn")
    assert [f.message for f in store.read_failures(2)[3]] == ["m0", "m1"]


def test_a_source_without_the_shim_or_a_checkpoint_says_what_to_add():
    with pytest.raises(RegionalConfigError, match=r"add \.option\('checkpointLocation'"):
        RegionalStreamReader({}, {"source": "files", "path": "/in"})


def test_the_shim_jar_records_exactly_the_setting_keys_of_the_python_side():
    """The shim's listener filters writeStream's options by the jar's setting-keys.txt (a target's credentials
    stay out of the store): it must be the list ``resolve_settings`` reads, or a setting would go unrecorded."""
    import zipfile

    from regional.protocol.settings import DEFAULTS
    from regional.shim_jar import SETTING_KEYS_RESOURCE, ensure_built

    jar = ensure_built()
    assert jar is not None, "the shim jar is built by the test command (python -m regional build-shim)"
    with zipfile.ZipFile(jar) as archive:
        keys = archive.read(SETTING_KEYS_RESOURCE).decode().split()
    assert keys == list(DEFAULTS)
