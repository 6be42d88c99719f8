"""Dead letters (deadLetterPath): isolation by bisection in plan and decide, and the dead-letter table's two
phases through commit_epoch, over a real store and a real Delta table on disk."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from regional.coordinator import commit_epoch
from regional.dead_letters import encode_records
from regional.errors import RegionalConfigError
from regional.inputs.files import SCHEMA, batch_of
from regional.protocol.decide import Outcome, TaskOutcome, decide, outcomes_from_tasks
from regional.protocol.plan import RegionRange, plan_epoch
from regional.protocol.settings import Settings, resolve_settings
from regional.store import EpochKind, EpochRecord, RegionState, Standing, Store
from support import MemoryTarget

ATTEMPTS = 2


def record_bytes(region: str, offset: int) -> bytes:
    return encode_records([batch_of(region, offset, pa.array([f"{region}-{offset}"], pa.string()))], SCHEMA)


def run_attempts(plan, fails: dict[str, dict[int, float]], attempts: int = ATTEMPTS) -> list[TaskOutcome]:
    """Each planned range runs up to ``attempts`` attempts; an attempt fails at the first record of the range
    that still has failures left (``fails[region][offset]``, ``inf`` for a poison record), and uses one of
    them up. All attempts failing quarantines the region; its quarantined attempt reads an isolated record."""
    out = []
    for i, rr in enumerate(plan.ranges):  # the regions' ranges, then the probes of isolated records' neighbours
        left = fails.get(rr.region, {})
        failed = 0
        for _ in range(attempts):
            bad = next((o for o in range(rr.start, rr.end) if left.get(o, 0) > 0), None)
            if bad is None:
                break
            left[bad] -= 1
            failed += 1
        if failed == attempts:
            letter = record_bytes(rr.region, rr.start) if rr.isolated else None
            out.append(TaskOutcome(i, attempts, Outcome.QUARANTINED, plan.query_id, rr.region, rr.start, rr.start,
                                   reason="quarantined", dead_letter=letter))
        else:
            out.append(TaskOutcome(i, failed, Outcome.WRITTEN, plan.query_id, rr.region, rr.start, rr.end,
                                   rr.end - rr.start, rr.start, rr.end - 1, f"{rr.region}@{rr.start}"))
    return out


def with_dead_letters(**kw) -> Settings:
    return Settings(dead_letter_path="/dead/letters", region_attempts=ATTEMPTS, **kw)


def suspected(offset: int, epoch: int, **kw) -> RegionState:
    """A region whose record at ``offset`` failed alone in epoch ``epoch - 2`` and whose probe passed in ``epoch - 1``:
    failing alone again in ``epoch`` is a try (docs/design.md, "Poison or outage")."""
    return RegionState(offset, None, 0, Standing.QUARANTINED, "q", isolating=(offset, offset + 1),
                       alone_since=epoch - 2, probe_passed=epoch - 1, **kw)


def test_a_quarantined_range_is_planned_in_halves_until_its_poison_record_stands_alone():
    s = with_dead_letters()
    plan = plan_epoch(0, "q", "ck", {}, {"a": 120, "b": 120}, s)
    record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, {"a": {37: math.inf}})), None)
    a = record.regions["a"]
    assert a.state is Standing.QUARANTINED and a.isolating == (0, 120) and a.consecutive_failures == 0
    ranges = []
    for epoch in range(1, 20):
        plan = plan_epoch(epoch, "q", "ck", record.regions, {"a": 120, "b": 120}, s)
        ranges += [(r.start, r.end, r.isolated) for r in plan.regions if r.region == "a"]
        record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, {"a": {37: math.inf}})), record)
        if record.dead_lettered:
            break
    # [0, 60) fails, [0, 30) passes, [30, 45) fails, [30, 37) passes, [37, 41) fails, ... 37 alone.
    assert ranges[:4] == [(0, 60, False), (0, 30, False), (30, 45, False), (30, 37, False)]
    # 37 alone fails, records of a beside it pass, 37 alone fails again: poison (b passing is no evidence)
    assert ranges[-3:] == [(37, 38, True)] * 3
    assert len(ranges) <= math.ceil(math.log2(120)) + 3
    assert [(r.region, r.start, r.end) for r in plan.probes] == [("a", 29, 37)]
    assert record.dead_lettered["a"].offset == 37 and record.kind is EpochKind.GLOBAL
    assert record.regions["a"].committed_offset == 38 and record.regions["a"].isolating is None
    assert record.regions["a"].dead_letters == 1 and record.regions["a"].state is Standing.OK
    plan = plan_epoch(epoch + 1, "q", "ck", record.regions, {"a": 120, "b": 120}, s)
    assert [(r.region, r.start, r.end, r.isolated) for r in plan.regions] == [("a", 38, 120, False)]


def test_without_dead_letter_path_a_quarantined_region_retries_its_whole_range():
    plan = plan_epoch(0, "q", "ck", {}, {"a": 120}, Settings(region_attempts=ATTEMPTS, max_failure_ratio=1.0))
    record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, {"a": {37: math.inf}})), None)
    assert record.regions["a"].isolating is None and record.regions["a"].consecutive_failures == 1
    plan = plan_epoch(1, "q", "ck", record.regions, {"a": 120}, plan.settings)
    assert [(r.start, r.end) for r in plan.regions] == [(0, 120)]


def test_an_isolated_record_is_not_dead_lettered_in_an_aborted_epoch_but_what_failed_is_kept():
    s = with_dead_letters(max_failure_ratio=0.0)  # any failure aborts the epoch
    states = {"a": suspected(0, 5), "b": RegionState(0)}
    plan = plan_epoch(5, "q", "ck", states, {"a": 9, "b": 3}, s)
    assert [(r.region, r.start, r.end, r.isolated) for r in plan.regions] == [("a", 0, 1, True), ("b", 0, 3, False)]
    assert [(r.region, r.start, r.end) for r in plan.probes] == [("a", 1, 9)]  # the records after it
    probe = TaskOutcome(2, 0, Outcome.WRITTEN, "q", "a", 1, 9, 8, 1, 8, "p")
    tasks = [TaskOutcome(0, ATTEMPTS, Outcome.QUARANTINED, "q", "a", 0, 0, dead_letter=record_bytes("a", 0)),
             TaskOutcome(1, 0, Outcome.FAILED, region="b", reason="target down"), probe]
    previous = EpochRecord(4, EpochKind.REGIONAL, {}, {}, states)
    record = decide(plan, outcomes_from_tasks(plan, tasks), previous)
    assert record.kind is EpochKind.ABORTED and not record.dead_lettered
    assert record.regions["a"].committed_offset == 0 and record.regions["a"].isolating == (0, 1)
    healthy = TaskOutcome(1, 0, Outcome.WRITTEN, "q", "b", 0, 3, 3, 0, 2, "h")
    record = decide(plan, outcomes_from_tasks(plan, [tasks[0], healthy, probe]), previous)
    assert record.kind is EpochKind.GLOBAL and record.dead_lettered["a"].offset == 0


def test_a_dead_letter_without_its_record_is_a_fall_back_not_done():
    s = with_dead_letters()
    plan = plan_epoch(3, "q", "ck", {}, {"a": 1}, s)
    plan = type(plan)(plan.query_id, plan.epoch, plan.store, (RegionRange("a", 0, 1, None, True),), s)
    task = TaskOutcome(0, ATTEMPTS, Outcome.QUARANTINED, "q", "a", 0, 0, reason="quarantined", dead_letter=None)
    outcome = outcomes_from_tasks(plan, [task])["a"]
    assert outcome.status is Outcome.MISSING and "could not read it" in (outcome.reason or "")


def test_dead_letter_path_is_a_setting_with_conf_default_on_local_disk_or_object_storage(tmp_path):
    conf = {"spark.regional.deadLetterPath": f"file://{tmp_path}/dl"}
    assert resolve_settings(conf, {}, {}).dead_letter_path == f"{tmp_path}/dl"
    assert resolve_settings(conf, {}, {"deadLetterPath": "rel/dl"}).dead_letter_path.endswith("/rel/dl")
    assert resolve_settings({}, {}, {}).dead_letter_path is None
    # one spelling of a location in plans, whichever the user gave
    assert resolve_settings({}, {"deadletterpath": "s3://bucket/dl/"}, {}).dead_letter_path == "s3a://bucket/dl"
    with pytest.raises(RegionalConfigError, match=r"deadLetterPath='hdfs://nn/dl'.*not hdfs:"):
        resolve_settings({}, {"deadletterpath": "hdfs://nn/dl"}, {})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 200), poison=st.sets(st.integers(0, 199), max_size=4),
       transient=st.dictionaries(st.integers(0, 199), st.integers(1, 2 * ATTEMPTS), max_size=4),
       healthy=st.integers(0, 50))
def test_isolation_finds_every_poison_record_and_publishes_everything_else_once_in_order(n, poison, transient,
                                                                                         healthy):
    """A region of n records with poison records (fail always) and transient ones (fail a few times), next to
    a healthy region with work in every epoch: every poison record is dead-lettered once, a record that fails
    fewer times than regionAttempts never is, everything else is committed once in offset order, and each poison
    record costs O(log n) epochs. (When nothing beside a suspect passes: ``test_a_record_with_no_neighbours_...``
    and ``test_a_quarantined_range_is_planned_in_halves_...``; outages: tests/test_outages.py.)"""
    poison = {p for p in poison if p < n}
    # A region of nothing but poison has no record beside a suspect to show that its region works, so nothing is
    # dead-lettered (an outage looks the same): test_a_record_with_no_neighbours_is_never_evidence_of_poison.
    assume(len(poison) < n)
    fails = {"p": {**{o: t for o, t in transient.items() if o < n}, **{o: math.inf for o in poison}}}
    s = with_dead_letters()
    available = {"p": n, "h": healthy + 1}
    record, published, dead = None, {"p": [], "h": []}, []
    # Each suspect costs O(log n) epochs, two more when nothing beside it passed (a probe), and p failing alone is
    # an outage that counts: every maxConsecutiveFailures-th epoch is then forced global.
    bound = ((len(poison) + len(transient)) * (math.ceil(math.log2(n)) + 5) + 2) * 11 // 10 + 2
    for epoch in range(bound):
        if record is not None and record.regions["p"].committed_offset == n:
            break
        available["h"] += 1
        plan = plan_epoch(epoch, "q", "ck", record.regions if record else {}, available, s)
        record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, fails)), record)
        for region, sl in record.committed.items():
            published[region] += list(range(sl.start, sl.end))
        dead += [d.offset for d in record.dead_lettered.values()]
        if any(r != "p" for r in record.committed):  # while another region passes, isolation forces nothing
            assert record.kind is not EpochKind.ABORTED and record.reason is None
    else:
        raise AssertionError(f"not done within {bound} epochs")
    assert sorted(dead) == dead and set(dead) >= poison
    assert all(transient.get(o, 0) >= ATTEMPTS or o in poison for o in dead)  # rarely failing: never dead
    assert sorted(published["p"] + dead) == list(range(n)) and published["p"] == sorted(published["p"])
    assert published["h"] == list(range(len(published["h"])))


def test_a_record_with_no_neighbours_is_never_evidence_of_poison():
    """A region whose only record fails alone, with no other region at work: nothing can show that records beside it
    pass (an outage looks the same), so it is never dead-lettered. It stays quarantined, named in its reason, its
    failures counted, and the epochs back off; it is not silently dropped."""
    s = with_dead_letters()
    record = None
    for epoch in range(12):
        plan = plan_epoch(epoch, "q", "ck", record.regions if record else {}, {"p": 1}, s)
        record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, {"p": {0: math.inf}})), record)
        assert not record.dead_lettered and not record.committed
    p = record.regions["p"]
    assert p.committed_offset == 0 and p.state is Standing.QUARANTINED and "no neighbour in its region" in p.reason
    assert record.outage_epochs > 1 and record.backoff_s > 1


# -- the dead-letter table through commit_epoch ---------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "ck")
    s.open_query()
    return s


def isolated_plan(store, dead_letter_path, epoch=1):
    """Epoch 1 isolates a@4, whose earlier failures and probe (epoch 0's record) make its failure now a try."""
    s = Settings(dead_letter_path=str(dead_letter_path), region_attempts=ATTEMPTS)
    store.write_record(EpochRecord(epoch - 1, EpochKind.REGIONAL, {}, {}, {"a": suspected(4, epoch)}))
    plan = plan_epoch(epoch, store.query_id(), str(store.checkpoint), {}, {"a": 5, "b": 8}, s)
    return type(plan)(plan.query_id, epoch, plan.store, (RegionRange("a", 4, 5, None, True), plan.regions[1]), s)


def tasks_of(plan, letter: bytes | None):
    return [TaskOutcome(0, ATTEMPTS, Outcome.QUARANTINED, plan.query_id, "a", 4, 4, reason="q", dead_letter=letter),
            TaskOutcome(1, 0, Outcome.WRITTEN, plan.query_id, "b", 0, 8, 8, 0, 7, "b@0-8")]


def test_commit_epoch_appends_the_dead_letter_once_even_when_the_driver_dies_after_the_intent(store, tmp_path):
    dlq = tmp_path / "dead"
    plan = isolated_plan(store, dlq)
    target = MemoryTarget()
    target.fail_commit = True  # the driver dies in phase two: the dead letter is published, the target is not
    with pytest.raises(RuntimeError):
        commit_epoch(plan, tasks_of(plan, record_bytes("a", 4)), store, target)
    intent = store.read_intent(1)
    assert intent is not None and set(intent.dead_letters) == {"a"} and intent.dead_letter_path == str(dlq)
    target.fail_commit = False
    record = commit_epoch(plan, tasks_of(plan, record_bytes("a", 4)), store, target)  # the re-run
    assert record.dead_lettered["a"].offset == 4 and target.commits == {1: {"b": "b@0-8"}}
    rows = DeltaTable(str(dlq)).to_pyarrow_table().to_pylist()
    assert rows == [{"region": "a", "offset": 4, "value": "a-4", "epoch": 1, "error": record.dead_lettered["a"].error}]
    assert "unknown" in rows[0]["error"]  # no JVM shim in a unit test: no failure record says why
    assert not any((dlq / "_regional_staging").rglob("*.parquet"))
    assert store.region_states()["a"].committed_offset == 5 and store.region_states()["a"].dead_letters == 1


def test_a_dead_letter_table_of_another_shape_is_refused_before_the_intent(store, tmp_path):
    dlq = tmp_path / "dead"
    from deltalake import write_deltalake

    write_deltalake(str(dlq), pa.table({"something": [1]}))
    plan = isolated_plan(store, dlq)
    with pytest.raises(RegionalConfigError, match="give each source type its own dead-letter table"):
        commit_epoch(plan, tasks_of(plan, record_bytes("a", 4)), store, MemoryTarget())
    assert store.read_intent(1) is None


def test_an_isolating_range_the_region_moved_past_is_replaced_not_kept():
    """Records lost to retention moved the region past its isolating range: a new quarantine starts a new one
    (with the old one kept, planning would ignore it and the region would retry its whole range for ever)."""
    s = with_dead_letters()
    states = {"a": RegionState(15, 3, 0, Standing.QUARANTINED, "q", isolating=(0, 10)), "b": RegionState(0, 3)}
    plan = plan_epoch(4, "q", "ck", states, {"a": 40, "b": 5}, s)  # b passes beside it: not an outage
    assert [(r.start, r.end, r.isolated) for r in plan.regions] == [(15, 40, False), (0, 5, False)]
    record = decide(plan, outcomes_from_tasks(plan, run_attempts(plan, {"a": {20: math.inf}})),
                    EpochRecord(3, EpochKind.REGIONAL, {}, {}, states))
    assert record.regions["a"].isolating == (15, 40) and record.regions["a"].consecutive_failures == 0


def test_a_rerun_of_a_decided_epoch_still_publishes_its_dead_letters(store, tmp_path):
    """The driver dies after the intent, before the dead letters are published; the re-run's commit (not
    ready_target) finishes the intent: the dead letter lands once. On 76362b1 that re-run dropped the intent's
    dead letters, and the record's offset counted as done: the record was lost."""
    from regional.targets import dead_letter_target

    dlq = tmp_path / "dead"
    plan = isolated_plan(store, dlq)
    dies = [True]

    def sink(location, query_id):
        target = dead_letter_target(location, query_id)
        commit = target.commit

        def dying_commit(epoch, handles, report=None):
            if dies.pop() if dies else False:
                raise RuntimeError("the driver dies before the dead letters are published")
            commit(epoch, handles, report)

        target.commit = dying_commit
        return target

    with pytest.raises(RuntimeError, match="dies before the dead letters"):
        commit_epoch(plan, tasks_of(plan, record_bytes("a", 4)), store, MemoryTarget(), dead_letter_sink=sink)
    assert store.read_intent(1) is not None and store.read_record(1) is None
    record = commit_epoch(plan, tasks_of(plan, record_bytes("a", 4)), store, MemoryTarget(), dead_letter_sink=sink)
    assert record.dead_lettered["a"].offset == 4
    rows = DeltaTable(str(dlq)).to_pyarrow_table().to_pylist()
    assert [(r["region"], r["offset"]) for r in rows] == [("a", 4)]


def test_the_dead_letter_brake_fails_the_epoch_and_dead_letters_nothing(store, tmp_path):
    """More isolated records failing in one epoch than maxDeadLettersPerEpoch: the query fails naming the error,
    nothing is dead-lettered, no intent is written, and what the tasks staged is discarded."""
    from regional.errors import RegionalDeadLetterLimitError

    dlq = tmp_path / "dead"
    plan = isolated_plan(store, dlq)
    plan = type(plan)(plan.query_id, plan.epoch, plan.store, plan.regions,
                      Settings(dead_letter_path=str(dlq), region_attempts=ATTEMPTS, max_dead_letters_per_epoch=0))
    target = MemoryTarget()
    with pytest.raises(RegionalDeadLetterLimitError, match="maxDeadLettersPerEpoch=0"):
        commit_epoch(plan, tasks_of(plan, record_bytes("a", 4)), store, target)
    assert store.read_intent(1) is None and store.epochs() == [0] and not (dlq / "_delta_log").exists()
    assert target.commits == {} and target.aborted == [(1, {"b": "b@0-8"})]


def test_dead_letter_topic_is_a_setting_that_isolates_and_is_refused_beside_a_path_or_malformed():
    """deadLetterTopic switches isolation on as deadLetterPath does; both at once are refused (one place, once);
    the plan and the intent carry the topic's name only."""
    s = resolve_settings({"spark.regional.deadLetterTopic": "orders.dead"}, {}, {})
    assert s.dead_letter_topic == "orders.dead" and s.dead_letter_path is None and s.isolates
    assert Settings.from_json(s.to_json()) == s
    old = {k: v for k, v in s.to_json().items() if k != "dead_letter_topic"}  # a plan written before topics
    assert Settings.from_json(old).dead_letter_topic is None
    assert not resolve_settings({}, {}, {}).isolates
    conf = {"spark.regional.deadLetterPath": "/dl"}
    assert resolve_settings(conf, {}, {"deadLetterPath": "", "deadLetterTopic": "t"}).dead_letter_topic == "t"
    with pytest.raises(RegionalConfigError, match="both given"):
        resolve_settings({}, {"deadLetterPath": "/dl"}, {"deadLetterTopic": "dead"})
    with pytest.raises(RegionalConfigError, match="not a Kafka topic name"):
        resolve_settings({}, {}, {"deadlettertopic": "dead letters"})
    states = {"a": RegionState(4, 3, 0, Standing.QUARANTINED, "q", isolating=(4, 12)), "b": RegionState(0, 3)}
    plan = plan_epoch(4, "q", "ck", states, {"a": 12, "b": 5}, Settings(dead_letter_topic="dead"))
    assert (plan.regions[0].region, plan.regions[0].start, plan.regions[0].end) == ("a", 4, 8)  # halves
    assert "sasl" not in str(plan.to_offset())


def test_an_intent_keeps_the_dead_letter_topic_and_reads_intents_written_before_it(store):
    from regional.store.model import Intent

    record = EpochRecord(3, EpochKind.REGIONAL, {}, {}, {})
    intent = Intent(record, {}, {}, {"a": "handle"}, None, "dead")
    assert Intent.from_json(intent.to_json()) == intent
    older = Intent(record, {}, {}, {"a": "h"}, "/dl")
    assert "dead_letter_topic" not in older.to_json() and Intent.from_json(older.to_json()) == older
