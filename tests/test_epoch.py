"""Phase two on the driver (commit_epoch) over a real store on disk and a target kept in memory."""

from dataclasses import replace

import pytest

from regional.coordinator import commit_epoch, ready_target
from regional.errors import RegionalConfigError, RegionalPlanError, RegionalStoreError
from regional.protocol.decide import Outcome, outcomes_from_tasks
from regional.protocol.plan import plan_epoch
from regional.protocol.settings import Settings
from regional.store import EpochKind, Standing, Store
from support import MemoryTarget, tasks_for


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path)
    s.open_query()
    return s


def next_plan(store, epoch, available, settings=None):
    return plan_epoch(epoch, store.query_id(), str(store.checkpoint), store.region_states(), available,
                      settings or Settings())


def test_failing_region_falls_back_then_catches_up(store):
    target = MemoryTarget()
    plan0 = next_plan(store, 0, {"a": 5, "b": 5})
    rec0 = commit_epoch(plan0, tasks_for(plan0, failing={"b"}), store, target)
    assert rec0.kind is EpochKind.REGIONAL and target.commits[0] == {"a": "a@0-5#0"}
    assert rec0.fallen_back["b"].ref_epoch == -1
    plan1 = next_plan(store, 1, {"a": 8, "b": 7})
    assert [(r.start, r.end) for r in plan1.regions] == [(5, 8), (0, 7)]  # b re-reads from 0
    rec1 = commit_epoch(plan1, tasks_for(plan1), store, target)
    assert rec1.kind is EpochKind.GLOBAL and target.commits[1] == {"a": "a@5-8#0", "b": "b@0-7#0"}
    assert store.region_states()["b"].committed_offset == 7


def test_rerun_after_a_crash_before_publishing_publishes_the_first_decision(store):
    target = MemoryTarget()
    plan = next_plan(store, 0, {"a": 5, "b": 5})
    target.fail_commit = True  # the driver dies in phase two, after the intent
    with pytest.raises(RuntimeError):
        commit_epoch(plan, tasks_for(plan, failing={"b"}), store, target)
    assert store.read_intent(0) is not None and store.read_record(0) is None
    target.fail_commit = False
    # the re-run's tasks fail differently: now a fails and b succeeds
    rec = commit_epoch(plan, tasks_for(plan, failing={"a"}, attempt=1), store, target)
    assert target.commits == {0: {"a": "a@0-5#0"}}  # what the first run decided
    assert set(rec.committed) == {"a"} and set(rec.fallen_back) == {"b"}
    assert (0, {"rerun:b": "b@0-5#1"}) in target.aborted  # the re-run's staging is discarded
    assert store.read_intent(0) is None  # pruned once recorded


def test_an_epoch_decided_by_a_dead_driver_is_finished_before_its_rerun_tasks_start(store):
    """A target whose staged slices hold locks (PostgreSQL) must not see the re-run's tasks before the
    interrupted epoch's slices are committed or rolled back."""
    target = MemoryTarget()
    opened, swept = [], []
    target.open = opened.append  # type: ignore[attr-defined]
    target.sweep = swept.append  # type: ignore[attr-defined]
    assert ready_target(store, target, "schema") is None and opened == ["schema"] and swept == []
    plan = next_plan(store, 0, {"a": 5, "b": 5})
    target.fail_commit = True
    with pytest.raises(RuntimeError):
        commit_epoch(plan, tasks_for(plan, failing={"b"}), store, target)
    target.fail_commit = False
    finished = ready_target(store, target, "schema")  # the restarted driver, before epoch 0's tasks re-run
    assert finished is not None and finished.epoch == 0 and set(finished.committed) == {"a"}
    assert target.commits == {0: {"a": "a@0-5#0"}} and store.read_record(0) == finished and swept[-1] == 0
    again = commit_epoch(plan, tasks_for(plan, attempt=1), store, target)  # the re-run's tasks: discarded
    assert again == finished and target.commits == {0: {"a": "a@0-5#0"}}
    assert target.aborted[-1] == (0, {"a": "a@0-5#1", "b": "b@0-5#1"})


def test_rerun_after_the_record_publishes_nothing_again(store):
    target = MemoryTarget()
    plan = next_plan(store, 0, {"a": 5})
    first = commit_epoch(plan, tasks_for(plan), store, target)
    target.commits.clear()
    again = commit_epoch(plan, tasks_for(plan, attempt=1), store, target)
    assert again == first and target.commits == {}
    assert target.aborted[-1] == (0, {"a": "a@0-5#1"})


def test_an_intent_lost_after_publishing_is_an_error_not_a_new_decision(store):
    target = MemoryTarget()
    plan = next_plan(store, 0, {"a": 5})
    target.commits[0] = {"a": "published before a crash"}  # the target has epoch 0; the store lost its intent
    with pytest.raises(RegionalStoreError, match="already published in the target"):
        commit_epoch(plan, tasks_for(plan), store, target)
    assert store.epochs() == []


def test_tiers_through_the_store(store):
    target, settings = MemoryTarget(), Settings(max_consecutive_failures=2)
    kinds = []
    for epoch in range(5):
        plan = next_plan(store, epoch, {"a": 10 * (epoch + 1), "b": 10}, settings)
        kinds.append(commit_epoch(plan, tasks_for(plan, failing={"b"}), store, target).kind)
    assert kinds == [EpochKind.REGIONAL, EpochKind.REGIONAL, EpochKind.ABORTED, EpochKind.REGIONAL,
                     EpochKind.REGIONAL]
    assert 2 not in target.commits
    assert store.region_states()["b"].state is Standing.FALLEN_BACK


def test_a_plan_of_another_query_publishes_nothing(store):
    target = MemoryTarget()
    plan = replace(next_plan(store, 0, {"a": 5}), query_id="11111111-1111-4111-8111-111111111111")
    with pytest.raises(RegionalStoreError, match="store belongs to query"):
        commit_epoch(plan, tasks_for(plan), store, target)
    assert target.commits == {} and target.aborted


def test_outcomes_that_do_not_add_up_fall_back_and_never_commit(store):
    plan = next_plan(store, 0, dict.fromkeys("abcdef", 10), Settings(max_failure_ratio=1.0))
    good = tasks_for(plan)
    tasks = [
        good[0],
        None,  # b: no message at all
        replace(good[2], query_id="11111111-1111-4111-8111-111111111111"),  # c: a receipt of another query
        replace(good[3], start=3),  # d: read from elsewhere
        replace(good[4], end=11, last_offset=9),  # e: claims past its range
        replace(good[5], status=Outcome.MISSING, reason="no finished read receipt"),  # f
    ]
    outcomes = outcomes_from_tasks(plan, tasks)
    assert outcomes["a"].status is Outcome.WRITTEN
    assert {r for r, o in outcomes.items() if o.status is Outcome.MISSING} == set("bcdef")
    record = commit_epoch(plan, tasks, store, MemoryTarget())
    assert set(record.committed) == {"a"} and set(record.fallen_back) == set("bcdef")
    assert all(record.regions[r].committed_offset == 0 for r in "bcdef")


def test_rows_of_another_region_or_outside_what_was_read_fail_clearly(store):
    plan = next_plan(store, 0, {"a": 5, "b": 5})
    tasks = tasks_for(plan)
    with pytest.raises(RegionalPlanError, match="2 planned regions"):
        commit_epoch(plan, tasks[:1], store, MemoryTarget())
    with pytest.raises(RegionalPlanError, match="shuffle"):
        commit_epoch(plan, [replace(tasks[0], region="b"), tasks[1]], store, MemoryTarget())
    with pytest.raises(RegionalPlanError, match="outside what its source read"):
        commit_epoch(plan, [replace(tasks[0], end=3), tasks[1]], store, MemoryTarget())
    assert store.epochs() == []


def test_a_cut_publishes_the_prefix_and_the_rest_moves_on(store):
    target = MemoryTarget()
    plan = next_plan(store, 0, {"a": 100})
    record = commit_epoch(plan, tasks_for(plan, cut={"a": 40}), store, target)
    assert record.kind is EpochKind.GLOBAL and record.committed["a"].end == 40
    assert [(r.start, r.end) for r in next_plan(store, 1, {"a": 100}).regions] == [(40, 100)]


def test_handles_must_be_json(store):
    target = MemoryTarget()
    plan = next_plan(store, 0, {"a": 5})
    tasks = [replace(tasks_for(plan)[0], handle=object())]
    with pytest.raises(RegionalConfigError, match="JSON-serialisable"):
        commit_epoch(plan, tasks, store, target)
    assert target.commits == {} and store.read_intent(0) is None and target.aborted


def test_a_quarantined_outcome_without_rows_falls_back_as_quarantined(store):
    plan = next_plan(store, 0, {"a": 5, "b": 5, "c": 5})
    record = commit_epoch(plan, tasks_for(plan, quarantined={"c"}), store, MemoryTarget())
    assert record.fallen_back["c"].quarantined and record.regions["c"].state is Standing.QUARANTINED


def test_spark_aborting_a_batch_whose_phase_two_failed_after_the_decision_loses_nothing(store, tmp_path,
                                                                                         monkeypatch):
    """Spark calls abort after a failed commit. Here the Delta commit landed and recording the epoch failed (a
    store outage): the abort must leave the published files, and the restart finishes the epoch as decided."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from regional.coordinator import abort_epoch
    from regional.targets import load_target

    table = tmp_path / "t"
    target = load_target({"target": "delta", "path": str(table), "queryid": store.query_id()})
    plan = next_plan(store, 0, {"a": 3, "b": 3})
    tasks = [replace(t, handle=target.prepare(0, t.region, iter([pa.record_batch(
        {"value": [f"{t.region}-{i}" for i in range(3)]})]))) for t in tasks_for(plan)]

    def outage(record):
        raise OSError("the store is unreachable")

    with monkeypatch.context() as m:
        m.setattr(store, "write_record", outage)
        with pytest.raises(OSError):
            commit_epoch(plan, tasks, store, target)
    abort_epoch(store, target, 0, {f"#{t.partition}": t.handle for t in tasks})  # what Spark does next

    rows = sorted(DeltaTable(str(table)).to_pyarrow_table().column("value").to_pylist())
    assert rows == ["a-0", "a-1", "a-2", "b-0", "b-1", "b-2"]
    restarted = load_target({"target": "delta", "path": str(table), "queryid": store.query_id()})
    finished = ready_target(store, restarted, pa.schema([("value", pa.string())]))
    assert finished is not None and finished.epoch == 0 and store.epochs() == [0]
    assert sorted(DeltaTable(str(table)).to_pyarrow_table().column("value").to_pylist()) == rows


def test_spark_aborting_an_undecided_batch_discards_its_staged_output(store):
    from regional.coordinator import abort_epoch

    target = MemoryTarget()
    abort_epoch(store, target, 0, {"#0": "a@0-5#0"})
    assert target.aborted == [(0, {"#0": "a@0-5#0"})]
