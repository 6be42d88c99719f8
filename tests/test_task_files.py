import time

from regional.spark.task_files import ReadReceipt, SinkWatch, TaskFiles, TaskKey


def test_receipts_round_trip_and_unreadable_ones_are_absent(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    files = TaskFiles(TaskKey("q/../x", 3, 1, 0, 17))
    assert files.read_receipt() is None
    receipt = ReadReceipt("qid", 3, "a/b", 10, 20, False, True, 1700000000.5)
    files.write_receipt(receipt)
    assert files.read_receipt() == receipt and files.receipt_path.is_relative_to(tmp_path)
    files.receipt_path.write_text("{torn")
    assert files.read_receipt() is None
    assert TaskFiles(TaskKey("q/../x", 3, 1, 1, 18)).receipt_path != files.receipt_path


def test_the_clock_starts_when_the_sink_receives_its_first_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    files = TaskFiles(TaskKey("q", 0, 0, 0, 1))
    watch = SinkWatch(files, timeout=0.2, startup_grace=0.3)
    assert not watch.expired()
    time.sleep(0.55)
    assert watch.expired()  # no sink rows at all: gives up after timeout + grace
    watch = SinkWatch(files, timeout=0.2, startup_grace=10)
    time.sleep(0.3)
    assert not watch.expired()  # the sink task started but has no rows yet: still waiting for it
    files.mark_receiving()  # its first rows: the deadline is now 0.2 s away, not 10.2 s
    assert not watch.expired()
    time.sleep(0.25)
    assert watch.expired()


def test_failed_attempts_and_older_epochs_leave_no_files(tmp_path, monkeypatch):
    """A failed attempt's sink never reads its receipt; an epoch's directory must not outlive its epoch."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    old = TaskFiles(TaskKey("q", 1, 0, 0, 3))
    old.write_receipt(ReadReceipt("qid", 1, "a", 0, None, False, True, 1.0))
    failed = TaskFiles(TaskKey("q", 5, 2, 0, 10))
    failed.write_receipt(ReadReceipt("qid", 5, "a", 0, None, False, True, 1.0))
    other = TaskFiles(TaskKey("q", 5, 12, 0, 11))  # partition 12: not an attempt of partition 2
    other.write_receipt(ReadReceipt("qid", 5, "b", 0, None, False, True, 1.0))
    retry = TaskFiles(TaskKey("q", 5, 2, 1, 13))
    retry.write_receipt(ReadReceipt("qid", 5, "a", 0, 4, False, True, 1.0))
    retry.remove_leftovers()
    assert not failed.receipt_path.exists() and retry.receipt_path.exists() and other.receipt_path.exists()
    assert not old.directory.exists()  # epoch 1 < 5 - 1
    retry.remove()
    other.remove()
    assert not retry.directory.exists()  # the last files of the epoch took its directory with them
