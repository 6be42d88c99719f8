"""target=kafka's review (issue 56), the parts without a broker: what a failed epoch's error says to do."""

from __future__ import annotations

from regional.targets.kafka.transaction import failure_hint

# What the epoch's KafkaTargetError held when the broker aborted a transaction that outlived
# kafka.transaction.timeout.ms=1000 (1,500,000 records produced on the review's own broker): librdkafka's
# fatal error of a fenced transactional producer, raised by the next produce().
FENCED_BY_TIMEOUT = 'KafkaError{code=_FATAL,val=-150,str="Unable to produce message: Local: Fatal error"}'


def test_a_transaction_aborted_for_its_timeout_says_which_setting_to_raise():
    """The error said "check that the brokers are up": the brokers were, and every restart failed the same way."""
    hint = failure_hint(FENCED_BY_TIMEOUT)
    assert "kafka.transaction.timeout.ms" in hint and "another run of this query" in hint
    assert "brokers are up" not in hint
    assert "brokers are up" in failure_hint('KafkaError{code=_TRANSPORT,val=-195,str="Broker transport failure"}')


def test_a_failed_epoch_leaves_no_producer_alive(tmp_path):
    """Phase two with the brokers out of reach: init_transactions times out, the epoch fails. Its producer stayed
    alive in the failure's traceback with init_transactions still running, so on a broker that came back it took
    a newer producer epoch and fenced the next attempt's producer in this process (found on a real broker: the
    restart's commit failed, fenced; a third one went through)."""
    import gc
    import socket
    import uuid

    import pytest
    from confluent_kafka import Producer

    from regional.targets.base import QUERY_ID_OPTION
    from regional.targets.kafka import KafkaTarget, KafkaTargetError

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    target = KafkaTarget({"kafka.bootstrap.servers": f"127.0.0.1:{port}", "topic": "t", "timeoutms": "1500",
                          "checkpointlocation": str(tmp_path), QUERY_ID_OPTION: uuid.uuid4().hex})

    def producers() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, Producer))

    before = producers()
    with pytest.raises(KafkaTargetError, match="could not be produced") as failed:
        target.commit(0, {"r": {"file": "0/r.arrow", "rows": 1, "topics": ["t"]}})
    assert failed.value is not None  # the failure is still held, as the query keeps its exception
    assert producers() == before
