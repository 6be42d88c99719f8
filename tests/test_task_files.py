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
