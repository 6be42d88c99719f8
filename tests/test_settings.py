import pytest

from regional.errors import RegionalConfigError
from regional.protocol.settings import Settings, given_settings, parse_duration, resolve_settings


def test_defaults_then_conf_then_either_side():
    # the dataclass holds 0 retries, as plans written before them; users get 4, a minute apart (issue 45)
    # and every suspect is resolved within 30 minutes, the query failing on one unproven then (issue 55)
    # and a burst of up to 16 poison records is proven as one set (issue 55)
    assert resolve_settings({}, {}, {}) == Settings(dead_letter_retries=4, dead_letter_retry_backoff_s=60.0,
                                                    suspect_timeout_s=1800.0, dead_letter_on_timeout=False,
                                                    suspects_together=16)
    conf = {"spark.regional.regionAttempts": "3", "spark.regional.maxFailureRatio": "0.25", "spark.other": "x"}
    s = resolve_settings(conf, {"regionattempts": "4"}, {"RETAINEPOCHS": "7", "regionTimeout": "1.5s"})
    assert (s.region_attempts, s.max_failure_ratio, s.retain_epochs, s.region_timeout_s) == (4, 0.25, 7, 1.5)


def test_the_same_key_with_two_values_is_refused_naming_both():
    pattern = r"regionAttempts is given twice.*readStream .*'1'.*writeStream .*'2'"
    with pytest.raises(RegionalConfigError, match=pattern):
        resolve_settings({}, {"regionAttempts": "1"}, {"regionattempts": "2"})
    assert resolve_settings({}, {"enabled": "false"}, {"enabled": "false"}).enabled is False


@pytest.mark.parametrize(("key", "value", "message"), [
    ("enabled", "maybe", "not a boolean"), ("regionAttempts", "0", "at least 1"),
    ("maxFailureRatio", "1.5", "between 0 and 1"), ("regionTimeout", "soon", "not a duration"),
    ("retainEpochs", "x", "whole number"), ("suspectTimeout", "4m", "no room for deadLetterRetries=4 tries"),
    ("suspectTimeout", "never", "not a duration"), ("onSuspectTimeout", "skip", "not a policy: use fail")])
def test_bad_values_say_what_is_wrong(key, value, message):
    with pytest.raises(RegionalConfigError, match=message):
        resolve_settings({f"spark.regional.{key}": value}, {}, {})


def test_durations_and_json_round_trip():
    assert parse_duration("t", "500ms") == 0.5 and parse_duration("t", "2 minutes") == 120.0
    s = resolve_settings({}, {"regionTimeout": "30s", "enabled": "false"}, {})
    assert Settings.from_json(s.to_json()) == s
    assert given_settings({"RegionAttempts": "3", "path": "/x"}) == {"regionAttempts": "3"}


def test_the_suspect_bound_leaves_room_for_the_retries_and_takes_either_policy():
    s = resolve_settings({}, {"deadLetterRetries": "0", "suspectTimeout": "12s"}, {"onSuspectTimeout": "DeadLetter"})
    assert (s.suspect_timeout_s, s.dead_letter_on_timeout) == (12.0, True)
    assert Settings.from_json(s.to_json()) == s
    old = s.to_json()
    del old["suspect_timeout_s"], old["dead_letter_on_timeout"]  # a plan written before issue 55: no bound
    assert Settings.from_json(old).suspect_timeout_s is None
    with pytest.raises(RegionalConfigError, match="give at least 250s"):
        resolve_settings({}, {"suspectTimeout": "4m"}, {})
