"""Kafka topics that change between runs (README's "Changes between restarts"): a topic deleted and created again
is seen by its topic id and follows failOnDataLoss; a subscription that drops a topic is allowed when everything
read from it was published, and refused naming its regions when not. Real broker, real Spark, real Delta."""

from __future__ import annotations

import time

import regional
from integration.helpers import assert_exactly_once, run_epochs, table_rows
from integration.test_kafka_source import FLAKY, expected, failure_of, kafka_stream, new_topic, produce, start


def next_epoch(ck) -> int:
    return max(e.epoch for e in regional.status(ck).epochs) + 1


def run_all(query) -> None:
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def recreate(broker, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again (a new topic id), once the broker has really let it go."""
    broker.delete_topic(topic)
    deadline = time.monotonic() + 60
    while True:
        try:
            broker.create_topic(topic, partitions)
            return
        except Exception:  # still being deleted
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def published_then_created_again(spark, kafka, tmp_path, before: int, after: int):
    """A 2-partition topic with ``before`` records per partition, all published; then deleted and created again
    with ``after`` (other) records per partition. Returns the topic, table, checkpoint and both topics' records."""
    topic = new_topic(kafka, 2)
    produce(kafka, topic, 2, before, "old")
    out, ck = tmp_path / "out", tmp_path / "ck"
    old = expected(kafka, topic)
    run_all(start(kafka_stream(spark, kafka, ck, topic), out, ck))
    recreate(kafka, topic, 2)
    produce(kafka, topic, 2, after, "new")
    return topic, out, ck, old, expected(kafka, topic)


def test_a_topic_created_again_with_more_records_fails_the_query_or_is_read_from_its_start(spark, kafka, tmp_path):
    """The old topic's 5 records per partition are published; the topic is deleted and created again with 12:
    the restart's committed offsets (5) would skip the new topic's first 5 records. failOnDataLoss=true (the
    default) fails naming the topic; failOnDataLoss=false reads the new topic from offset 0, every record once."""
    topic, out, ck, old, new = published_then_created_again(spark, kafka, tmp_path, 5, 12)
    message = failure_of(start(kafka_stream(spark, kafka, ck, topic), out, ck))
    assert f"topic {topic!r} was deleted and created again (topic id" in message, message[-2000:]
    assert "failOnDataLoss=false" in message
    assert sorted(table_rows(out)) == sorted((r, o, v) for r, recs in old.items() for o, v in recs)
    run_all(start(kafka_stream(spark, kafka, ck, topic, failOnDataLoss="false"), out, ck))
    landed = sorted(table_rows(out))
    want = sorted((r, o, v) for part in (old, new) for r, recs in part.items() for o, v in recs)
    assert landed == want  # the new topic's offsets 0..4 are other records than the old topic's: both land once
    run_all(start(kafka_stream(spark, kafka, ck, topic), out, ck))  # the ids are settled: no failure, no re-read
    assert sorted(table_rows(out)) == want


def test_a_topic_created_again_while_its_region_falls_back_is_read_from_its_start_once(spark, kafka, tmp_path):
    """failOnDataLoss=false, and the re-created topic's partition 0 fails in the first epoch after: it is reset
    again at the next plan (its offset still belongs to the old topic), then read once."""
    topic, out, ck, old, new = published_then_created_again(spark, kafka, tmp_path, 3, 8)
    sick, following = f"{topic}-0", next_epoch(ck)
    run_all(start(kafka_stream(spark, kafka, ck, topic, failOnDataLoss="false"), out, ck, target=FLAKY,
                  failRegion=sick, failEpochs=str(following)))
    first_after = next(e for e in regional.status(ck).epochs if e.epoch == following)
    assert sick in first_after.fallen_back  # the fault did hit the reset region
    want = sorted((r, o, v) for part in (old, new) for r, recs in part.items() for o, v in recs)
    assert sorted(table_rows(out)) == want


def test_a_subscription_that_drops_a_topic_is_allowed_when_it_was_all_published_and_refused_when_not(
        spark, kafka, tmp_path):
    first, second = new_topic(kafka, 1), new_topic(kafka, 1)
    produce(kafka, first, 1, 4, "one")
    produce(kafka, second, 1, 4, "two")
    out, ck = tmp_path / "out", tmp_path / "ck"
    both = f"{first},{second}"
    run_all(start(kafka_stream(spark, kafka, ck, both), out, ck))
    produce(kafka, first, 1, 3, "one-more")
    third = new_topic(kafka, 1)
    produce(kafka, third, 1, 2, "three")
    run_all(start(kafka_stream(spark, kafka, ck, f"{second},{third}"), out, ck))  # first dropped, third added
    published = expected(kafka, second) | expected(kafka, third)
    published[f"{first}-0"] = expected(kafka, first)[f"{first}-0"][:4]  # what was read of it before it was dropped
    assert_exactly_once(out, published, spark)
    # second's region falls back (its target is down), then the subscription drops it: refused, naming it. The
    # target stays down in the second run: a plan logged before the stop re-runs first (it reads the dropped
    # partition as planned) and falls back again.
    produce(kafka, second, 1, 3, "two-more")
    down = tmp_path / "second-down"
    down.touch()
    sick = {"target": FLAKY, "failRegion": f"{second}-0", "failWhileExists": str(down)}
    run_epochs(start(kafka_stream(spark, kafka, ck, f"{second},{third}"), out, ck, **sick), ck,
               len(regional.status(ck).epochs) + 1)
    assert regional.status(ck).regions[f"{second}-0"].ref_epoch is not None  # fallen back: records unpublished
    message = failure_of(start(kafka_stream(spark, kafka, ck, third), out, ck, **sick))
    assert f"region(s) '{second}-0' are no longer selected by this query's options" in message, message[-2000:]
