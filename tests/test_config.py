import pytest

from regional.config import RegionalPolicy, merge_options, parse_duration
from regional.errors import RegionalConfigError


def test_options_override_conf_which_overrides_defaults():
    conf = {"spark.regional.maxConsecutiveFailures": "3", "spark.regional.maxFailureRatio": "0.2",
            "spark.sql.shuffle.partitions": "7"}
    merged = merge_options(conf, {"MaxFailureRatio": "0.9"})
    policy = RegionalPolicy.from_options(merged)
    assert policy.max_consecutive_failures == 3
    assert policy.max_failure_ratio == 0.9
    assert policy.enabled is True
    assert "sql.shuffle.partitions" not in merged


@pytest.mark.parametrize(("key", "value", "message"), [
    ("enabled", "maybe", "not a boolean"),
    ("maxConsecutiveFailures", "0", "at least 1"),
    ("maxConsecutiveFailures", "ten", "whole number"),
    ("maxFailureRatio", "1.5", "between 0 and 1"),
    ("regionTimeout", "soon", "not a duration"),
])
def test_bad_values_name_the_key(key, value, message):
    with pytest.raises(RegionalConfigError, match=message) as err:
        RegionalPolicy.from_options(merge_options({}, {key: value}))
    assert key in str(err.value)


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("500ms", 0.5), ("2 minutes", 120), ("1.5", 1.5)])
def test_durations(text, seconds):
    assert parse_duration("regionTimeout", text) == seconds
