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
