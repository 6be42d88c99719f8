"""Property-based: whatever the tasks report, epoch after epoch, every offset of every region is
published exactly once, in order, and no committed offset passes what was written."""

from __future__ import annotations

import tempfile
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from regional.coordinator import commit_epoch
from regional.protocol.decide import Outcome, TaskOutcome
from regional.protocol.plan import plan_epoch
from regional.protocol.settings import Settings
from regional.store import Store
from regional.targets.base import Target

REGIONS = ["a", "b", "c"]
KINDS = ["written", "failed", "quarantined", "cut", "missing", "no-message", "bad-receipt"]


class LedgerTarget(Target):
    """Publishes handles "region:start:end" into a ledger; idempotent per epoch, like a real target."""

    def __init__(self):
        self.ledger: dict[str, list[int]] = {r: [] for r in REGIONS}
        self.committed_epochs: set[int] = set()
        self.crash: tuple[int, str] | None = None  # (epoch, "before" | "after" publishing)

    def prepare(self, epoch, region, batches):
        raise AssertionError("not used")

    def commit(self, epoch, handles, report=None):
        crash, self.crash = self.crash, None
        if crash == (epoch, "before"):
            raise RuntimeError("the driver dies before publishing")
        if epoch not in self.committed_epochs:
            self.committed_epochs.add(epoch)
            for handle in handles.values():
                region, start, end = handle.split(":")
                self.ledger[region].extend(range(int(start), int(end)))
        if crash == (epoch, "after"):
            raise RuntimeError("the driver dies after publishing, before the record")

    def abort(self, epoch, handles):
        pass

    def published(self, epoch):
        return epoch in self.committed_epochs


def outcome(i, rr, kind, cut_at, query_id, attempt):
    if kind == "no-message":
        return None
    if kind == "failed":
        return TaskOutcome(i, attempt, Outcome.FAILED, region=rr.region, reason="target down")
    if kind == "quarantined":
        return TaskOutcome(i, attempt, Outcome.QUARANTINED, query_id, rr.region, rr.start, rr.start)
    if kind == "missing":
        return TaskOutcome(i, attempt, Outcome.MISSING, region=rr.region, reason="no receipt")
    end = rr.end if kind != "cut" else rr.start + 1 + cut_at % (rr.end - rr.start)
    task = TaskOutcome(i, attempt, Outcome.WRITTEN, query_id, rr.region, rr.start, end, end - rr.start, rr.start,
                       end - 1, f"{rr.region}:{rr.start}:{end}", seconds=(cut_at % 7) * 0.4)  # regionTimeout sizing
    return replace(task, start=rr.start + 1) if kind == "bad-receipt" else task


epochs_strategy = st.lists(
    st.tuples(st.dictionaries(st.sampled_from(REGIONS), st.integers(0, 7)),  # new records per region
              st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 50)), min_size=3, max_size=3),
              st.sampled_from([None, "before", "after"])),  # a crash in phase two, then a re-run
    min_size=1, max_size=14)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(epochs_strategy, st.integers(1, 4), st.floats(0, 1), st.sampled_from([None, 1.0]))
def test_every_offset_is_published_exactly_once_and_in_order(epochs, max_consecutive, ratio, timeout):
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(tmp)
        query_id = store.open_query()
        target = LedgerTarget()
        run_settings = Settings(max_consecutive_failures=max_consecutive, max_failure_ratio=ratio,
                                region_timeout_s=timeout)
        available = dict.fromkeys(REGIONS, 0)
        written_up_to = dict.fromkeys(REGIONS, 0)
        epoch = 0
        for added, kinds, crash in epochs:
            for region, n in added.items():
                available[region] += n
            plan = plan_epoch(epoch, query_id, tmp, store.region_states(), available, run_settings)
            if not plan.regions:
                continue

            def tasks(attempt, kinds=kinds, plan=plan):
                # a re-run's tasks report other outcomes than the first run's
                return [outcome(i, rr, *kinds[(i + attempt) % 3], query_id, attempt)
                        for i, rr in enumerate(plan.regions)]

            first, rerun = tasks(0), tasks(1)
            for t in first + rerun:
                if t is not None and t.status is Outcome.WRITTEN:
                    written_up_to[t.region] = max(written_up_to[t.region], t.end or 0)
            if crash:
                target.crash = (epoch, crash)
                try:
                    commit_epoch(plan, first, store, target)
                except RuntimeError:
                    pass
                commit_epoch(plan, rerun, store, target)
            else:
                commit_epoch(plan, first, store, target)
            epoch += 1

        states = store.region_states()
        for region in REGIONS:
            published = target.ledger[region]
            committed = states[region].committed_offset if region in states else 0
            assert published == list(range(committed)), (region, published, committed)
            assert committed <= written_up_to[region]
