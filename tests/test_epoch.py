"""The driver side of the epoch protocol, over a real store on disk and an in-memory target."""

import pytest

from regional.config import RegionalPolicy
from regional.decision import EpochKind, RegionState, Status
from regional.epoch import TaskReport, commit_epoch
from regional.errors import RegionalConfigError, RegionalPlanError
from regional.plan import RegionCursor, plan_epoch
from regional.store import Store


class MemoryTarget:
    """A target that keeps published rows in memory and refuses to publish an epoch twice."""

    def __init__(self):
        self.published: dict[int, dict] = {}
        self.aborted: list = []
        self.fail_commit = False

    def prepare(self, epoch, region, batches):
        raise AssertionError("not used here")

    def commit(self, epoch, handles):
        if self.fail_commit:
            raise RuntimeError("target down")
        if epoch in self.published:
            return  # idempotent
        self.published[epoch] = dict(handles)

    def abort(self, epoch, handles):
        self.aborted.append((epoch, dict(handles)))


def reports_for(plan, failing=(), attempt=0):
    out = []
    for i, r in enumerate(plan.regions):
        if r.region in failing:
            out.append(TaskReport(i, attempt, Status.FAILED, r.region, r.start, r.end - 1, 0, None, "boom"))
        elif r.has_work:
            out.append(TaskReport(i, attempt, Status.WRITTEN, r.region, r.start, r.end - 1, r.end - r.start,
                                  f"{r.region}@{r.start}-{r.end}#{attempt}"))
        else:
            out.append(TaskReport(i, attempt, Status.WRITTEN))
    return out


def next_plan(store, epoch, available):
    cursors = {r: RegionCursor(s.committed_offset, s.current_epoch) for r, s in store.region_states().items()}
    return plan_epoch(epoch, str(store.checkpoint), cursors, available)


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path)


def test_failing_region_falls_back_then_catches_up(store):
    target, policy = MemoryTarget(), RegionalPolicy()
    plan0 = next_plan(store, 0, {"a": 5, "b": 5})
    rec0 = commit_epoch(plan0, reports_for(plan0, failing={"b"}), store, target, policy)
    assert rec0.kind is EpochKind.REGIONAL and target.published[0] == {"a": "a@0-5#0"}
    assert rec0.fallen_back["b"].ref_epoch == -1
    plan1 = next_plan(store, 1, {"a": 8, "b": 7})
    assert [(r.start, r.end) for r in plan1.regions] == [(5, 8), (0, 7)]  # b re-reads from 0
    rec1 = commit_epoch(plan1, reports_for(plan1), store, target, policy)
    assert rec1.kind is EpochKind.GLOBAL and target.published[1] == {"a": "a@5-8#0", "b": "b@0-7#0"}
    assert store.region_states()["b"].committed_offset == 7


def test_rerun_after_a_crash_before_publishing_publishes_the_first_decision(store, monkeypatch):
    target, policy = MemoryTarget(), RegionalPolicy()
    plan = next_plan(store, 0, {"a": 5, "b": 5})
    target.fail_commit = True  # the driver dies in phase two, after the intent
    with pytest.raises(RuntimeError):
        commit_epoch(plan, reports_for(plan, failing={"b"}), store, target, policy)
    assert store.read_intent(0) is not None and store.read_record(0) is None
    target.fail_commit = False
    # the re-run's tasks fail differently: now a fails and b succeeds
    rec = commit_epoch(plan, reports_for(plan, failing={"a"}, attempt=1), store, target, policy)
    assert target.published == {0: {"a": "a@0-5#0"}}  # what the first run decided
    assert set(rec.committed) == {"a"} and set(rec.fallen_back) == {"b"}
    assert (0, {"rerun:b": "b@0-5#1"}) in target.aborted  # the re-run's staging is discarded
    assert store.read_intent(0) is None  # pruned once recorded


def test_rerun_after_the_record_publishes_nothing_again(store):
    target, policy = MemoryTarget(), RegionalPolicy()
    plan = next_plan(store, 0, {"a": 5})
    first = commit_epoch(plan, reports_for(plan), store, target, policy)
    target.published.clear()
    again = commit_epoch(plan, reports_for(plan, attempt=1), store, target, policy)
    assert again == first and target.published == {}
    assert target.aborted[-1] == (0, {"a": "a@0-5#1"})


def test_tiers_through_the_store(store):
    target, policy = MemoryTarget(), RegionalPolicy(max_consecutive_failures=2)
    kinds = []
    for epoch in range(5):
        plan = next_plan(store, epoch, {"a": 10 * (epoch + 1), "b": 10})
        kinds.append(commit_epoch(plan, reports_for(plan, failing={"b"}), store, target, policy).kind)
    assert kinds == [EpochKind.REGIONAL, EpochKind.REGIONAL, EpochKind.ABORTED,
                     EpochKind.REGIONAL, EpochKind.REGIONAL]
    assert 2 not in target.published
    assert store.region_states()["b"].state is RegionState.FALLEN_BACK


def test_a_store_mismatch_publishes_nothing(store, tmp_path):
    target = MemoryTarget()
    plan = plan_epoch(0, str(tmp_path / "elsewhere"), {}, {"a": 5})
    with pytest.raises(RegionalConfigError, match="same checkpointLocation"):
        commit_epoch(plan, reports_for(plan), store, target, RegionalPolicy())
    assert target.published == {} and target.aborted


def test_reports_that_do_not_match_the_plan_are_refused(store):
    plan = next_plan(store, 0, {"a": 5, "b": 5})
    reports = reports_for(plan)
    with pytest.raises(RegionalPlanError, match="2 planned regions"):
        commit_epoch(plan, reports[:1], store, MemoryTarget(), RegionalPolicy())
    swapped = [TaskReport(0, 0, Status.WRITTEN, "b", 0, 4, 5, "h"), reports[1]]
    with pytest.raises(RegionalPlanError, match="shuffle"):
        commit_epoch(plan, swapped, store, MemoryTarget(), RegionalPolicy())
    assert store.epochs() == []
