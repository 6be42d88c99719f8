"""``python -m regional status``: prints the store's read model (``regional.store.status``)."""

from __future__ import annotations

import json
import time

from regional.protocol.decide import utc
from regional.store.model import describe
from regional.store.status import QueryStatus, status


def render(st: QueryStatus, epochs: bool = True) -> str:
    """The status as text: one line for the query, a table of regions, then the epochs."""
    behind = sum(1 for s in st.regions.values() if s.ref_epoch is not None)
    lags = [lag for r in st.regions if (lag := st.lag(r)) is not None]
    if st.last_epoch is None:
        return (f"checkpoint {st.checkpoint}: a regional query with no epoch decided yet: its regions show once "
                "its first epoch is recorded")
    lines = [f"checkpoint {st.checkpoint}: {len(st.regions)} regions ({behind} behind), epoch "
             f"{st.last_epoch}, {st.regional_epochs} regional epochs, oldest ref_epoch "
             f"{st.oldest_ref_epoch}, max lag {max(lags) if lags else '-'}"]
    if st.regions:
        width = max(6, *(len(r) for r in st.regions))
        headroom = st.log_starts is not None
        dead = any(s.dead_letters or s.isolating for s in st.regions.values())
        lines.append(f"  {'region':<{width}}  {'committed':>10}  {'latest':>10}  {'lag':>8}  {'ref_epoch':>9}  "
                     f"{'ref age':>12}  {'failures':>8}  " + (f"{'headroom':>9}  " if headroom else "")
                     + (f"{'dead':>6}  " if dead else "") + "state")
        for region, s in sorted(st.regions.items()):
            latest, lag = st.latest_offset(region), st.lag(region)
            age_epochs, age_s = st.ref_age(region)
            age = "-" if age_epochs is None else f"{age_epochs}e/{_seconds(age_s)}"
            why = f"  ({s.reason})" if s.reason and s.ref_epoch is not None else ""
            if s.isolating is not None:
                why = f"  isolating offsets [{s.isolating[0]}, {s.isolating[1]}){why}"
            retry = st.retry(region)
            if retry is not None:
                tries, of, due = retry
                when = "?" if due is None else (
                    "now" if due <= st.now else f"at {utc(due)} (in {_seconds(due - st.now)})")
                why = (f"  offset {s.committed_offset} failed alone {tries} of {of} tries; next try {when} "
                       f"(deadLetterRetries){why}")
            waiting = st.waiting(region)
            if waiting is not None and waiting[0] != "retry":
                due = waiting[1]
                when = "?" if due is None else (
                    "now" if due <= st.now else f"at {utc(due)} (in {_seconds(due - st.now)})")
                why = (f"  WAITING, {LOOKS_LIKE[waiting[0]]}: offset {s.committed_offset} failed alone "
                       f"{s.alone_waits} time(s) in a row; next try {when}{why}")
            bound = st.resolved_by(region)
            if bound is not None:
                why += (f"  resolved by {utc(bound[0])} at the latest: dead-lettered once proven poison, else "
                        f"{bound[1]} (suspectTimeout, onSuspectTimeout)")
            if s.timed_range is not None:
                why += f"  straggler: ranges of at most {s.timed_range} offsets (regionTimeout)"
            lines.append(f"  {region:<{width}}  {s.committed_offset:>10}  {_dash(latest):>10}  {_dash(lag):>8}  "
                         f"{_dash(s.ref_epoch):>9}  {age:>12}  {s.consecutive_failures:>8}  "
                         + (f"{_dash(st.retention_headroom(region)):>9}  " if headroom else "")
                         + (f"{s.dead_letters:>6}  " if dead else "") + f"{s.state.value}{why}")
    if epochs:
        for e in st.epochs:
            lines.append(f"  {describe(e)}")
            lines.extend(f"      {r}: {f.reason}" for r, f in sorted(e.fallen_back.items()))
            lines.extend(f"      {r}: offsets [{a}, {b}) were gone from the source (failOnDataLoss=false)"
                         for r, (a, b) in sorted(e.lost.items()))
            lines.extend(f"      {r}: offset {d.offset} dead-lettered: {d.error}" if d.count == 1 else
                         f"      {r}: offsets {d.offset} to {d.offset + d.count - 1} dead-lettered, proven poison "
                         f"together (suspectsTogether); the first: {d.error}"
                         for r, d in sorted(e.dead_lettered.items()))
    return "\n".join(lines)


LOOKS_LIKE = {
    "outage": "looks like an outage, not poison (records of its region beside it failed too, or it has none to try)",
    "evidence": "poison or an outage that ended (records of its region beside it passed since; one more failure "
                "alone counts as a try)",
}


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def _seconds(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


def show(checkpoint: str, as_json: bool, epochs: int, watch: float | None) -> None:
    """The CLI's ``status``: once, or refreshed in place every ``watch`` seconds until interrupted."""
    while True:
        st = status(checkpoint, epochs)
        text = json.dumps(st.to_json(), indent=2) if as_json else render(st)
        if watch is None:
            print(text)
            return
        print("\x1b[H\x1b[2J" + text, flush=True)  # home and clear: refresh in place
        time.sleep(watch)
