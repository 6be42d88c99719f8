"""The store's read model, written for the JVM shim's Spark UI tab and metrics (``<checkpoint>/regional/status.json``).

Phase two asks for a snapshot after each recorded epoch; a thread of the driver's sink process takes it and writes it
when the epoch is done, at most once per ``REGIONAL_STATUS_INTERVAL_S`` (default 2 s) and at most a twentieth of a core
(a snapshot of 1,000 regions takes about 50 ms, of 10,000 about 0.5 s: one every 10 s), so the epoch never waits
for it.
A stopped or failed query's source writes one last snapshot, waiting for it at most 10 s
(``RegionalStreamReader.stop``), so the tab shows how a query ended. The snapshot is a view: a failure to write
it is logged and never fails an epoch.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from regional.store import Store
from regional.store.status import SNAPSHOT_EPOCHS, snapshot, status
from regional.switches import switched_on

log = logging.getLogger("regional")

INTERVAL_ENV = "REGIONAL_STATUS_INTERVAL_S"

def enabled() -> bool:
    return switched_on("REGIONAL_STATUS")


def write_snapshot(checkpoint: str) -> None:
    """Take and write a snapshot now."""
    from regional.cli.timeline import svg

    st = status(checkpoint, SNAPSHOT_EPOCHS)
    Store(checkpoint).write_status(snapshot(st, svg(st)))


class StatusPublisher:
    """One per process: the newest request per checkpoint wins; one thread writes them."""

    def __init__(self) -> None:
        self._pending: set[str] = set()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._failed: set[str] = set()  # checkpoints whose failure was logged (once, until it works again)

    def request(self, checkpoint: str) -> None:
        if not enabled():
            return
        with self._wake:
            self._pending.add(checkpoint)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="regional-status", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        interval = float(os.environ.get(INTERVAL_ENV, "2") or 2)
        while True:
            with self._wake:
                while not self._pending:
                    self._wake.wait()
                pending, self._pending = self._pending, set()
            began = time.monotonic()
            for checkpoint in pending:
                self.publish(checkpoint)
            # Requests meanwhile coalesce into one snapshot. A snapshot costs about 50 ms per 1,000 regions: the
            # pause grows with it, so that the snapshots never take more than a twentieth of a core.
            time.sleep(max(interval, 19 * (time.monotonic() - began)))

    def publish_final(self, checkpoint: str, timeout_s: float) -> None:
        """A last snapshot (the query stops or failed), waited for at most ``timeout_s``; none if no epoch was
        recorded. Never raises."""
        def last() -> None:
            try:
                if Store(checkpoint).epochs():
                    self.publish(checkpoint)
            except Exception as exc:
                log.warning("regional: no last status snapshot of %s: %s", checkpoint, exc)

        thread = threading.Thread(target=last, name="regional-status-final", daemon=True)
        thread.start()
        thread.join(timeout_s)

    def publish(self, checkpoint: str) -> None:
        try:
            write_snapshot(checkpoint)
            self._failed.discard(checkpoint)
        except Exception as exc:  # a view: never the epoch's failure
            if checkpoint not in self._failed:
                self._failed.add(checkpoint)
                log.warning("regional: could not write the status snapshot of %s for the Spark UI and metrics: %s",
                            checkpoint, exc)


PUBLISHER = StatusPublisher()
