"""The exactly-once checker must see every kind of fault: a checker that cannot fail proves nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from regional.testing.exactly_once import Landed, check

EXPECTED = {"a": [(0, "A0"), (1, "A1"), (2, "A2"), (3, "A3")], "b": [(10, "B10"), (12, "B12")]}  # b: offset gaps


def landed(*rows: tuple[str, int, str, int]) -> list[Landed]:
    return [Landed(*row) for row in rows]


ALL = landed(("a", 0, "A0", 1), ("a", 1, "A1", 1), ("a", 2, "A2", 2), ("a", 3, "A3", 3), ("b", 10, "B10", 1),
             ("b", 12, "B12", 2))


def test_everything_once_in_order_is_ok():
    report = check(EXPECTED, ALL)
    assert report.ok and report.expected == report.landed == 6, report.explain()


def test_each_kind_of_fault_is_reported():
    assert check(EXPECTED, ALL[:3] + ALL[4:]).lost == [("a", 3)]
    assert check(EXPECTED, [*ALL, ALL[1]]).duplicated == [("a", 1)]
    assert check(EXPECTED, [*ALL[:1], Landed("a", 1, "A1", 5), *ALL[2:]]).out_of_order == [("a", 1)]  # came late
    assert check(EXPECTED, [*ALL[:5], Landed("b", 12, "b12", 2)]).wrong == [(("b", 12), "b12", "B12")]
    assert check(EXPECTED, [*ALL, Landed("c", 0, "C0", 1)]).wrong == [(("c", 0), "C0", None)]


def test_an_unfinished_run_may_lack_a_tail_but_not_a_gap():
    assert check(EXPECTED, ALL[:2] + ALL[4:5], complete=False).ok
    assert check(EXPECTED, ALL[:2] + ALL[4:5]).lost == [("a", 2), ("a", 3), ("b", 12)]
    assert check(EXPECTED, [ALL[0], ALL[2]], complete=False).lost == [("a", 1)]  # nothing published past a gap


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 30), data=st.data())
def test_any_single_fault_is_found(n, data):
    """One region of n records published in random batches, then one fault: dropped, doubled, moved to a later
    publication, or changed."""
    expected = {"r": [(o * 3, f"v{o}") for o in range(n)]}  # offsets with gaps, as Kafka's
    cuts = sorted(data.draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=5)))
    rows, version = [], 0
    for i, (offset, value) in enumerate(expected["r"]):
        version += i in cuts
        rows.append(Landed("r", offset, value, version))
    assert check(expected, rows).ok
    i = data.draw(st.integers(0, n - 1))
    fault = data.draw(st.sampled_from(["drop", "double", "later", "change"]))
    if fault == "drop":
        rows.pop(i)
    elif fault == "double":
        rows.append(rows[i])
    elif fault == "later":
        if i == n - 1:
            return  # the last record published later is still in order
        rows[i] = Landed("r", rows[i].offset, rows[i].value, version + 1)
    else:
        rows[i] = Landed("r", rows[i].offset, rows[i].value + "!", rows[i].published)
    assert not check(expected, rows).ok
