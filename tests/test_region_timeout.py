import time

from regional.region_timeout import SinkWatch, mark_sink_receiving


def test_the_clock_starts_when_the_sink_receives_its_first_rows(tmp_path):
    path = tmp_path / "p" / "0-0"
    watch = SinkWatch(path, timeout=0.2, startup_grace=0.3)
    assert not watch.expired()
    time.sleep(0.55)
    assert watch.expired()  # no sink rows at all: gives up after timeout + grace
    watch = SinkWatch(path, timeout=0.2, startup_grace=10)
    time.sleep(0.3)
    assert not watch.expired()  # the sink task started but has no rows yet: still waiting for it
    mark_sink_receiving(path)  # its first rows: the deadline is now 0.2 s away, not 10.2 s
    assert not watch.expired()
    time.sleep(0.25)
    assert watch.expired()
