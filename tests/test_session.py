from regional.protocol.settings import Settings
from regional.spark.session import retries_warning, task_max_failures


def test_task_attempts_from_the_master_and_conf():
    assert task_max_failures("local[4,3]", None) == 3
    assert task_max_failures("local[*, 5]", None) == 5
    assert task_max_failures("local[4]", "8") == 1  # local mode ignores spark.task.maxFailures
    assert task_max_failures("spark://127.0.0.1:7077", "6") == 6
    assert task_max_failures("spark://127.0.0.1:7077", None) == 4


def test_register_warns_in_one_line_when_there_is_no_room_to_quarantine():
    policy = Settings(region_attempts=2)
    warning = retries_warning("local[4]", None, policy)
    assert warning and "\n" not in warning and "local[N,3]" in warning and "maxFailures to at least 3" in warning
    assert retries_warning("local[4,2]", None, policy) is not None  # attempts 0, 1: none left to quarantine
    assert retries_warning("local[4,3]", None, policy) is None
    assert retries_warning("local[4]", None, Settings(enabled=False)) is None
